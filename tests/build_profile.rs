//! The dev profile builds every compile-time-only package (proc macros, build-script helpers and
//! what only they use) unoptimized. `[profile.dev.package."*"]` outranks `build-override` in cargo's
//! profile precedence, so each such package must be named in the root Cargo.toml; a new one that
//! is not would quietly lengthen a newcomer's first build.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

#[test]
fn every_compile_time_only_package_builds_unoptimized() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let proc_macro: BTreeSet<&str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["targets"].as_array().unwrap().iter().any(|t| t["kind"].to_string().contains("proc-macro")))
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    let nodes: HashMap<&str, &serde_json::Value> =
        meta["resolve"]["nodes"].as_array().unwrap().iter().map(|n| (n["id"].as_str().unwrap(), n)).collect();
    let members: BTreeSet<&str> =
        meta["workspace_members"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();

    // What runs: the workspace, its normal dependencies and its members' dev-dependencies, never
    // entering a proc macro or a build dependency.
    let mut runs = BTreeSet::new();
    let mut stack: Vec<&str> = members.iter().copied().collect();
    while let Some(id) = stack.pop() {
        if !runs.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let kinds: Vec<&serde_json::Value> =
                dep["dep_kinds"].as_array().unwrap().iter().map(|k| &k["kind"]).collect();
            let reached =
                kinds.iter().any(|k| k.is_null()) || (members.contains(id) && kinds.iter().any(|k| *k == "dev"));
            let pkg = dep["pkg"].as_str().unwrap();
            if reached && !proc_macro.contains(pkg) {
                stack.push(pkg);
            }
        }
    }
    let running: BTreeSet<&str> = runs.iter().map(|id| name_of[id]).collect();
    let compile_time_only: BTreeSet<&str> =
        nodes.keys().filter(|id| !runs.contains(*id)).map(|id| name_of[id]).filter(|n| !running.contains(n)).collect();

    let manifest: toml::Value = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
    let profiles = &manifest["profile"]["dev"]["package"];
    let optimized: Vec<&str> = compile_time_only
        .iter()
        .copied()
        .filter(|name| profiles.get(*name).and_then(|p| p.get("opt-level")).and_then(|l| l.as_integer()) != Some(0))
        .collect();
    assert!(
        optimized.is_empty(),
        "compile-time-only packages without `{{ opt-level = 0 }}` in [profile.dev.package] of Cargo.toml: {optimized:?}"
    );
}
