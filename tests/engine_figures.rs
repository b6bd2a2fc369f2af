//! The engine's figures while a local model that streams its experts from disk writes an answer:
//! `status --json` gives the expert cache hit rate, disk read rate and prefetch recall of the
//! running job (docs/STATUS.md), `status` prints them, and `status --watch`, drawn in tmux, shows
//! them under its bar. Once its prompt is in, `status` also says how the prompt went in.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;

/// A small MoE model (2 layers of 16 experts) with SmolLM2's tokenizer and chat template, written
/// by `model synth`: its 3.4 MiB of experts stream through a 1 MiB cache.
fn synth(dir: &std::path::Path) -> std::path::PathBuf {
    let out = dir.join("moe.gguf");
    let status = std::process::Command::new(common::BIN)
        .args(["model", "synth", "--layers", "2", "--experts", "16", "--top-k", "2", "--hidden", "256"])
        .args(["--expert-ffn", "256", "--tokenizer-from"])
        .arg(common::demo_model())
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    out
}

#[test]
fn status_shows_the_engine_figures_of_a_job_being_written() {
    let daemon = Daemon::start_with(|dir| {
        let model = format!(
            "backend = \"local\"\npath = \"{}\"\nexpert_cache_mb = 1\nmax_tokens = 100000\ntemperature = 0",
            synth(dir).display()
        );
        common::config_answering(dir, "", "unused", 1).replace("backend = \"openai\"\nurl = \"unused\"", &model)
    });
    common::ask_kimi(
        &daemon,
        "From: me@nightmail.test\r\nSubject: stream it\r\nMessage-ID: <moe@t>\r\n\r\nWrite at length.",
    );

    // status --json: the running job's engine object, with a disk rate and a hit rate in [0, 1].
    let deadline = Instant::now() + Duration::from_secs(120);
    let engine = loop {
        let jobs = daemon.jobs();
        if let Some(engine) = jobs[0].get("engine").filter(|e| e["cache_hit_rate"].is_number()) {
            break engine.clone();
        }
        assert!(Instant::now() < deadline, "no engine figures: {jobs:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let hits = engine["cache_hit_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hits), "{engine}");
    assert!(engine["disk_mb_per_s"].as_f64().unwrap() >= 0.0, "{engine}");

    // The prompt: all of it run (no saved state to reuse), its time apart from the answer's.
    let prompt = loop {
        let jobs = daemon.jobs();
        if let Some(prompt) = jobs[0].get("prompt") {
            break prompt.clone();
        }
        assert!(Instant::now() < deadline, "no prompt figures: {jobs:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let tokens = prompt["tokens"].as_u64().unwrap();
    assert!(tokens > 10, "{prompt}");
    assert_eq!(prompt["prefilled_tokens"].as_u64(), Some(tokens), "{prompt}");
    assert_eq!(prompt["reused_tokens"].as_u64(), Some(0), "{prompt}");
    assert!(prompt["prefill_secs"].as_f64().unwrap() >= 0.0, "{prompt}");

    // Plain `status` prints them under the job's line.
    let out = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("engine: cache hits "), "{text}");
    assert!(text.contains(&format!("prompt: {tokens} tokens (0 reused), in ")), "{text}");

    // status --watch draws them under the job's bar.
    let command = format!("{} --config {} status --watch", common::BIN, daemon.config.display());
    let tmux = common::Tmux::start(&format!("figures{}", std::process::id()), &command, daemon.dir.path());
    tmux.wait_for("engine: cache hits ");
    let screen = tmux.screen();
    assert!(screen.contains("MB/s, prefetch recall "), "{screen}");
}
