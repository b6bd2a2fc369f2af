//! The engine's figures while a local model that streams its experts from disk writes an answer:
//! `status --json` gives the expert cache hit rate, disk read rate and prefetch recall of the
//! running job (docs/STATUS.md), `status` prints them, and `status --watch`, drawn in tmux, shows
//! them under its bar.

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

    // Plain `status` prints them under the job's line.
    let out = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("engine: cache hits "), "{text}");

    // status --watch draws them under the job's bar.
    let command = format!("{} --config {} status --watch", common::BIN, daemon.config.display());
    let tmux = common::Tmux::start(&format!("figures{}", std::process::id()), &command, daemon.dir.path());
    tmux.wait_for("engine: cache hits ");
    let screen = tmux.screen();
    assert!(screen.contains("MB/s, prefetch recall "), "{screen}");
}
