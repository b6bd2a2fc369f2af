//! The command line: `check-config`, `serve`'s start-up errors, `user add`, `status`,
//! `model inspect`, `model tokenize`, `model generate --draft` and `model plan` into a closed pipe.

mod common;

use std::process::Command;

use common::{BIN, Daemon, Raw};

fn nightmail(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_shipped_config_checks_clean() {
    let out = Command::new(BIN)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env_remove("NIGHTMAIL_CONFIG")
        .arg("check-config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("config/nightmail.toml: ok (1 users, 1 models"), "{text}");
    assert!(!stderr(&out).contains("warning"), "the shipped config has no warnings: {}", stderr(&out));
}

/// The newcomer's path: `client-config mutt` into a file, `mutt -F` it, and the only question mutt
/// asks is the password (no "create ~/Mail?", no certificate prompt); then the INBOX is open.
#[test]
fn mutt_with_client_config_asks_only_for_the_password() {
    let daemon = Daemon::start();
    let mut smtp = Raw::login(daemon.smtp);
    assert!(smtp.cmd("MAIL FROM:<me@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("RCPT TO:<me@nightmail.test>").starts_with("250"));
    assert!(smtp.cmd("DATA").starts_with("354"));
    smtp.send(b"From: me@nightmail.test\r\nSubject: Hello newcomer\r\n\r\nwelcome\r\n.\r\n");
    assert!(smtp.reply().starts_with("250"));

    // The test daemon listens on ports the system picked; the user's configuration names fixed ones.
    let fixed = daemon.dir.path().join("fixed.toml");
    let text = std::fs::read_to_string(&daemon.config).unwrap();
    let text =
        text.replacen("127.0.0.1:0", &daemon.smtp.to_string(), 1).replacen("127.0.0.1:0", &daemon.imap.to_string(), 1);
    std::fs::write(&fixed, text).unwrap();
    let out = Command::new(BIN).arg("--config").arg(&fixed).args(["client-config", "mutt"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rc = daemon.dir.path().join("client.muttrc");
    std::fs::write(&rc, &out.stdout).unwrap();

    common::external("mutt", "mutt");
    // HOME is a fresh directory: no ~/.muttrc, no ~/Mail, no accepted certificates.
    let home = tempfile::tempdir().unwrap();
    let command = format!("env HOME={} mutt -n -F {}", home.path().display(), rc.display());
    let tmux = common::Tmux::start(&format!("newcomer{}", std::process::id()), &command, daemon.dir.path());
    tmux.wait_for("Password for me@127.0.0.1");
    let screen = tmux.screen();
    assert!(!screen.contains("Create") && !screen.contains("eject"), "a question before the password:\n{screen}");
    tmux.keys(&[common::PASSWORD, "Enter"]);
    tmux.wait_for("Hello newcomer");
    assert!(!home.path().join("Mail").exists(), "mutt made no local folder");
}

/// The demo password is in the README: on an address other machines reach, `serve` refuses it
/// (the Docker image listens on 0.0.0.0 inside its container). On loopback it starts.
#[test]
fn serve_refuses_the_demo_password_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nm.toml");
    let text = common::config(dir.path(), "").replace("correct horse", "nightmail");
    std::fs::write(
        &config,
        text.replace("listen = \"127.0.0.1:0\"\nmax_message_bytes", "listen = \"0.0.0.0:0\"\nmax_message_bytes"),
    )
    .unwrap();
    let out = Command::new(BIN).arg("--config").arg(&config).arg("serve").output().unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("user `me` has the demo password and smtp.listen = 0.0.0.0:0 is not loopback")
            && err.contains("nightmail user add me --address me@nightmail.test"),
        "{err}"
    );
    // The same users on loopback: the quick start.
    let mut daemon = Daemon::start_with(|dir| common::config(dir, "").replace("correct horse", "nightmail"));
    let mut raw = Raw::connect(daemon.smtp);
    assert!(raw.reply().starts_with("220 "));
    assert!(raw.cmd("EHLO test").starts_with("250"));
    let token = common::base64_plain("me", "nightmail");
    assert!(raw.cmd(&format!("AUTH PLAIN {token}")).starts_with("235"));
    daemon.stop();
}

/// The service files in config/: systemd's own checker finds nothing to say about the unit (run
/// against this build's binary), the unit runs `serve` as an unprivileged user, and the launchd
/// plist parses (Python's plistlib reads Apple's format) and runs `serve` too.
#[test]
fn the_systemd_unit_and_launchd_plist_are_valid() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let unit = std::fs::read_to_string(format!("{root}/config/nightmail.service")).unwrap();
    assert!(unit.contains("\nUser=nightmail\n") && unit.contains("\nExecStart=/usr/local/bin/nightmail serve\n"));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("nightmail.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/nightmail", BIN)).unwrap();
    let out = common::external("systemd-analyze", "systemd").arg("verify").arg(&copy).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "systemd-analyze: {}", stderr(&out));

    let plist = format!("{root}/config/local.nightmail.plist");
    let script = format!(
        "import plistlib; p = plistlib.load(open({plist:?}, 'rb')); print(p['Label'], p['ProgramArguments'], p['KeepAlive'])"
    );
    let out = common::external("python3", "python3").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "local.nightmail ['/usr/local/bin/nightmail', 'serve'] {'SuccessfulExit': False}"
    );
}

#[test]
fn client_config_names_an_unknown_user() {
    let daemon = Daemon::start();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&daemon.config)
        .args(["client-config", "aerc", "--user", "bob"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no user `bob` in the configuration (users: me, ann)"), "{}", stderr(&out));
    let out = nightmail(&["client-config", "outlook"]);
    assert!(stderr(&out).contains("possible values: mutt, neomutt, aerc, thunderbird"), "{}", stderr(&out));
}

#[test]
fn config_mistakes_name_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = nightmail(&["--config", path.to_str().unwrap(), "check-config"]);
        assert!(!out.status.success());
        stderr(&out)
    };
    let unknown = check("hostname = \"x.org\"\n\n[smtp]\nmax_message_byte = 10\n");
    assert!(unknown.contains("bad.toml:4:1: unknown field `max_message_byte`"), "{unknown}");
    let address = check("[[model]]\naddress = \"kimi at x\"\nbackend = \"openai\"\n");
    assert!(address.contains("bad.toml:2:") && address.contains("model.address"), "{address}");
    let missing = nightmail(&["--config", "/nonexistent/nightmail.toml", "check-config"]);
    assert!(stderr(&missing).contains("cannot read /nonexistent/nightmail.toml"), "{}", stderr(&missing));
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nightmail.toml");
    let config = common::config(dir.path(), "").replace("127.0.0.1:0", &taken.local_addr().unwrap().to_string());
    std::fs::write(&path, config).unwrap();
    let out = Command::new(BIN).arg("serve").env("NIGHTMAIL_CONFIG", &path).output().unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("smtp.listen") && err.contains("is in use") && err.contains("to a free address"), "{err}");
}

#[test]
fn user_add_stores_an_argon2_hash_that_logs_in() {
    let mut daemon = Daemon::start();
    daemon.stop();
    let mut add = Command::new(BIN)
        .args(["user", "add", "bob", "--address", "Bob@Nightmail.test", "--config"])
        .arg(&daemon.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    add.stdin.take().unwrap().write_all(b"bobs password\n").unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&daemon.config).unwrap();
    assert!(text.contains("name = \"bob\"") && text.contains("password_hash = \"$argon2id$"), "{text}");
    assert!(!text.contains("bobs password"));

    daemon.restart();
    let mut c = Raw::connect(daemon.smtp);
    c.reply();
    c.cmd("EHLO x");
    let token = common::base64_plain("bob@nightmail.test", "bobs password");
    assert_eq!(c.cmd(&format!("AUTH PLAIN {token}")), "235 2.7.0 Authentication successful");
    // AUTH LOGIN, the other mechanism, on a second connection.
    let mut c = Raw::connect(daemon.smtp);
    c.reply();
    c.cmd("EHLO x");
    assert_eq!(c.cmd("AUTH LOGIN"), "334 VXNlcm5hbWU6");
    assert_eq!(c.cmd(&common::base64_encode(b"bob")), "334 UGFzc3dvcmQ6");
    assert_eq!(c.cmd(&common::base64_encode(b"bobs password")), "235 2.7.0 Authentication successful");
}

#[test]
fn status_asks_the_running_daemon() {
    let daemon = Daemon::start();
    let status = daemon.status();
    assert_eq!(status["source"], "daemon");
    assert_eq!(status["jobs"], serde_json::json!([]));
    let human = daemon.cli(&["status"]);
    assert_eq!(String::from_utf8_lossy(&human.stdout), "no jobs\n");
}

#[test]
fn empty_password_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.toml");
    let out = Command::new(BIN)
        .args(["user", "add", "x", "--address", "x@y.org", "--config"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no password given"), "{}", stderr(&out));
    assert!(!path.exists(), "nothing is written on error");
}

#[test]
fn model_inspect_describes_latent_attention_yarn_and_grouped_routing() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3");
    for path in [dir.clone(), dir.join("model.gguf")] {
        let text = inspect(&path);
        assert!(text.contains("architecture   DeepseekV3"), "{text}");
        assert!(text.contains("latent (MLA): 4 heads, kv latent 16 + rope key 8 cached per token"), "{text}");
        assert!(text.contains("YaRN factor 4 over original context 16"), "{text}");
        assert!(text.contains("in 2 MoE layers") && text.contains("sigmoid routing in 4 groups (best 2)"), "{text}");
        assert!(text.contains("× 2.5"), "{text}");
    }
}

#[test]
fn model_inspect_names_deepseek_sparse_attention_from_either_format() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    for (name, architecture) in [("deepseek_v32", "DeepseekV32"), ("glm_moe_dsa", "GlmMoeDsa")] {
        for path in [fixtures.join(name), fixtures.join(name).join("model.gguf")] {
            let text = inspect(&path);
            assert!(text.contains(&format!("architecture   {architecture}")), "{text}");
            assert!(text.contains("latent (MLA): 4 heads"), "{text}");
            assert!(text.contains("an indexer of 8 heads of 16 keeps each query's 4 best keys"), "{text}");
        }
    }
}

#[test]
fn model_inspect_describes_gpt_oss_windows_sinks_routing_and_mxfp4_experts() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let dir = fixtures.join("gpt_oss");
    for path in [dir.clone(), dir.join("model.gguf"), fixtures.join("gpt_oss_mxfp4")] {
        let text = inspect(&path);
        assert!(text.contains("architecture   GptOss"), "{text}");
        assert!(text.contains("sliding window 5 on 1 of 2 layers, attention sinks"), "{text}");
        assert!(text.contains("YaRN factor 8 over original context 256, beta 32/1 (ramp not rounded)"), "{text}");
        assert!(text.contains("top-2 logits, softmax over them"), "{text}");
        assert!(text.contains("clamped SwiGLU (alpha 1.702, limit 7)"), "{text}");
    }
    let text = inspect(&fixtures.join("gpt_oss_mxfp4"));
    assert!(text.contains("MXFP4 (4 tensors"), "{text}");
}

#[test]
fn model_inspect_states_a_k3_directorys_layers_by_kind_its_weights_and_what_a_budget_holds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3");
    let out = nightmail(&["model", "inspect", dir.to_str().unwrap(), "--memory-mb", "64"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("architecture   KimiK3"), "{text}");
    assert!(
        text.contains("layers         6 (0 attention, 2 latent attention, 4 KDA linear attention; 1 dense, 5 MoE)"),
        "{text}"
    );
    assert!(
        text.contains("expert ffn 8 in a latent of 16 (Stable LatentMoE)")
            && text.contains("SiTU (beta 4, linear beta 25)"),
        "{text}"
    );
    assert!(text.contains("(40 routed experts in all)") && text.contains("expert weights 60.0 KiB"), "{text}");
    assert!(
        text.contains("memory         64.0 MiB holds 6 of 6 layers") && text.contains("100% of experts hit, 0 B read"),
        "{text}"
    );
    // The directory carries no template: it is prompted in K3's own format, built in.
    assert!(text.contains("chat template built in"), "{text}");
}

/// `nightmail model plan M | head`: the reader goes away, and the command ends as a Unix filter
/// does, killed by SIGPIPE without a word, not with a panic on stderr.
#[test]
fn a_model_command_whose_reader_has_gone_ends_quietly_like_a_filter() {
    use std::os::unix::process::ExitStatusExt;
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3/model.gguf");
    // The read end is closed before the command starts, so its first write meets EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args(["model", "plan", model.to_str().unwrap(), "--memory-mb", "64", "--disk-gbps", "1"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {}", out.status, stderr(&out));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
}

/// llama.cpp's vocabulary-only `models/ggml-vocab-NAME.gguf` (scripts/fetch-llama-cpp-src.sh)
/// and its tokenizer cases: each `.inp` text with the ids of its `.out` line.
fn llama_cpp_vocab(name: &str) -> (std::path::PathBuf, Vec<(String, Vec<u32>)>) {
    let dir = std::env::var_os("NIGHTMAIL_LLAMA_CPP_SRC").unwrap_or_else(|| {
        panic!(
            "NIGHTMAIL_LLAMA_CPP_SRC is not set: run `export NIGHTMAIL_LLAMA_CPP_SRC=$(scripts/fetch-llama-cpp-src.sh)`"
        )
    });
    let path = std::path::PathBuf::from(dir).join("models").join(format!("ggml-vocab-{name}.gguf"));
    let read = |ext: &str| std::fs::read_to_string(path.with_extension(format!("gguf.{ext}"))).unwrap();
    let inp = read("inp");
    let texts = inp.strip_suffix("\n__ggml_vocab_test__\n").unwrap_or(&inp).split("\n__ggml_vocab_test__\n");
    let ids =
        read("out").lines().map(|l| l.split_whitespace().map(|i| i.parse().unwrap()).collect()).collect::<Vec<_>>();
    (path.clone(), texts.map(str::to_string).zip(ids).collect())
}

#[test]
fn model_tokenize_gives_llama_cpps_ids_from_a_vocabulary_only_gguf() {
    let (vocab, cases) = llama_cpp_vocab("llama-bpe");
    let vocab = vocab.to_str().unwrap();
    let tokenize = |extra: &[&str]| -> serde_json::Value {
        let out = nightmail(&[&["model", "tokenize", "--model", vocab, "--json"], extra].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (text, ids) = cases.iter().find(|(t, _)| t == "Hello world").expect("llama.cpp's cases hold Hello world");
    let plain = tokenize(&["--text", text, "--no-add-special", "--no-parse-special"]);
    assert_eq!(plain["tokens"], serde_json::json!(ids));
    // Llama 3's vocabulary adds BOS, as llama.cpp's llama-tokenize does by default.
    let with_bos = tokenize(&["--text", text]);
    let tokens = with_bos["tokens"].as_array().unwrap();
    assert_eq!((tokens.len(), &tokens[1..]), (ids.len() + 1, &plain["tokens"].as_array().unwrap()[..]));
    // Every case from a file, as the text's ids.
    let dir = tempfile::tempdir().unwrap();
    for (i, (text, ids)) in cases.iter().enumerate().filter(|(_, (t, _))| !t.is_empty()) {
        let file = dir.path().join(format!("case-{i}.txt"));
        std::fs::write(&file, text).unwrap();
        let got = tokenize(&["--file", file.to_str().unwrap(), "--no-add-special", "--no-parse-special"]);
        assert_eq!(got["tokens"], serde_json::json!(ids), "{text:?}");
    }
    // Without --json: the ids on one line.
    let out = nightmail(&["model", "tokenize", "--model", vocab, "--text", text, "--no-add-special"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line: Vec<u32> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|i| i.parse().unwrap()).collect();
    assert_eq!(&line, ids);
}

#[test]
fn model_tokenize_names_an_unknown_pre_tokenizer_and_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (vocab, _) = llama_cpp_vocab("gpt-2");
    let mut bytes = std::fs::read(&vocab).unwrap();
    // The same length, so the file stays well formed: "gpt-2" becomes "gpt-9". A GGUF string
    // value follows its key, its type (u32) and its length (u64).
    let key = bytes.windows(18).position(|w| w == b"tokenizer.ggml.pre").expect("the key is in the file");
    let value = key + 18 + 4 + 8;
    assert_eq!(&bytes[value..value + 5], b"gpt-2");
    bytes[value + 4] = b'9';
    let file = dir.path().join("vocab.gguf");
    std::fs::write(&file, bytes).unwrap();
    let out = nightmail(&["model", "tokenize", "--model", file.to_str().unwrap(), "--text", "hi"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("`gpt-9`") && e.contains("kimi-k2") && e.contains("llama-bpe"), "{e}");
}

/// `nightmail model inspect PATH`'s output, which must succeed.
fn inspect(path: &std::path::Path) -> String {
    let out = nightmail(&["model", "inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn model_generate_with_lookup_drafts_gives_the_plain_text_in_fewer_verify_steps() {
    let model = common::demo_model();
    let generate = |draft: &str| -> serde_json::Value {
        let out = nightmail(&[
            "model",
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--chat",
            "--prompt",
            "Repeat after me, word for word: the blue van is parked behind the old library on Elm Street.",
            "--max-new-tokens",
            "24",
            "--json",
            "--draft",
            draft,
            // Guess all lookup finds: how many pay for their rows depends on this machine's load.
            "--draft-row-cost",
            "0",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (plain, drafted) = (generate("none"), generate("lookup"));
    assert_eq!(drafted["text"], plain["text"]);
    assert_eq!(drafted["tokens"], plain["tokens"]);
    let steps = |v: &serde_json::Value| v["verify_steps"].as_u64().unwrap();
    assert_eq!(steps(&plain), plain["tokens"].as_array().unwrap().len() as u64 - 1, "{plain}");
    assert!(steps(&drafted) < steps(&plain), "{drafted}");
    let bad =
        nightmail(&["model", "generate", "--model", model.to_str().unwrap(), "--prompt", "hi", "--draft", "medusa"]);
    assert!(
        !bad.status.success() && stderr(&bad).contains("use \"lookup\", \"model\", \"mtp\" or \"none\""),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn model_generate_with_a_draft_model_gives_the_plain_text_in_fewer_verify_steps() {
    let model = common::demo_model();
    let model = model.to_str().unwrap();
    let generate = |draft: &[&str]| -> serde_json::Value {
        let mut args = vec!["model", "generate", "--model", model, "--chat", "--prompt"];
        args.extend(["Write one sentence about the sea.", "--max-new-tokens", "16", "--json"]);
        args.extend(draft);
        let out = nightmail(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The demo model as its own draft model: it shares the tokenizer, and its guesses hold.
    let (plain, drafted) = (generate(&[]), generate(&["--draft-model", model, "--draft-row-cost", "0"]));
    assert_eq!(drafted["text"], plain["text"]);
    assert_eq!(drafted["tokens"], plain["tokens"]);
    let steps = |v: &serde_json::Value| v["verify_steps"].as_u64().unwrap();
    assert!(steps(&drafted) * 3 < steps(&plain), "{drafted}");
    for (args, says) in [
        (&["--draft", "model"][..], "--draft model needs --draft-model PATH"),
        (&["--draft", "lookup", "--draft-model", model][..], "drop --draft, or --draft-model"),
        (&["--draft-model", "/nonexistent/small.gguf"][..], "loading draft model /nonexistent/small.gguf"),
    ] {
        let mut all = vec!["model", "generate", "--model", model, "--prompt", "hi"];
        all.extend(args);
        let bad = nightmail(&all);
        assert!(!bad.status.success() && stderr(&bad).contains(says), "{args:?}: {}", stderr(&bad));
    }
}

#[test]
fn model_generate_with_the_models_mtp_layer_gives_the_plain_tokens_or_says_it_has_none() {
    // The deepseek_v3_mtp fixture (random weights: its guesses seldom hold, tests/mtp.rs).
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3_mtp");
    let generate = |draft: &str| -> serde_json::Value {
        let out = nightmail(&[
            "model",
            "generate",
            "--model",
            fixture.to_str().unwrap(),
            "--prompt-tokens",
            "5,17,99,3",
            "--max-new-tokens",
            "12",
            "--json",
            "--draft",
            draft,
            "--draft-row-cost",
            "0",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (plain, drafted) = (generate("none"), generate("mtp"));
    assert_eq!(drafted["tokens"], plain["tokens"]);
    assert!(drafted["drafted"].as_u64().unwrap() > 0, "{drafted}");
    let inspect = nightmail(&["model", "inspect", fixture.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("mtp            1 multi-token-prediction layer(s)"), "{text}");
    // Its tensors (mtp.safetensors: 44, 192 KiB of them routed experts) apart from the model's.
    assert!(text.contains("mtp weights    44 tensors, ") && text.contains("(192.0 KiB of routed experts)"), "{text}");
    let model = common::demo_model();
    let bad = nightmail(&["model", "generate", "--model", model.to_str().unwrap(), "--prompt", "hi", "--draft", "mtp"]);
    let said = stderr(&bad);
    assert!(!bad.status.success() && said.contains("no multi-token-prediction layer"), "{said}");
    assert!(said.contains("`llama.nextn_predict_layers`") && said.contains(model.to_str().unwrap()), "{said}");
}
