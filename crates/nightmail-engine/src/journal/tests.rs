use std::os::unix::fs::FileExt;

use super::*;
use crate::sampling::Sampling;
use candle_core::{Device, Tensor};

fn identity() -> Identity {
    Identity {
        model: "m".into(),
        network: vec![2, 4],
        weights: Vec::new(),
        prompt: vec![1, 2, 3],
        sampling: Sampling::greedy(),
        stop: Vec::new(),
        stop_at_eos: true,
        template: None,
        tool_calls: None,
    }
}

fn rows(from: usize, to: usize) -> Vec<(Tensor, Tensor)> {
    (0..2)
        .map(|l| {
            let n = to - from;
            let k: Vec<f32> = (0..2 * n * 3).map(|i| (l * 1000 + from * 10 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            (
                Tensor::from_vec(k, (1, 2, n, 3), &Device::Cpu).unwrap(),
                Tensor::from_vec(v, (1, 2, n, 3), &Device::Cpu).unwrap(),
            )
        })
        .collect()
}

fn append(j: &mut Journal, tokens: &[u32], to: usize) {
    let from = j.saved().1;
    let logits = vec![tokens.len() as f32; 5];
    j.append(&Delta {
        tokens,
        sampler_position: tokens.len() as u128 * 7,
        kv: rows(from, to).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect(),
        end_position: to,
        logits: &logits,
    })
    .unwrap();
}

/// A record without logits up to position `to`, after `tokens`.
fn part(j: &mut Journal, tokens: &[u32], to: usize) {
    let from = j.saved().1;
    let kv = rows(from, to).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect();
    j.append(&Delta { tokens, sampler_position: 0, kv, end_position: to, logits: &[] }).unwrap();
}

#[test]
fn prompt_parts_replay_short_of_the_prompt_and_never_after_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let eight = Identity { prompt: (1..=8).collect(), ..identity() };
    let (mut j, _) = Journal::open(&path, &eight, 2).unwrap();
    part(&mut j, &[], 3);
    part(&mut j, &[], 5);
    let good = std::fs::metadata(&path).unwrap().len();
    // Not a prompt part: it ends at the prompt's end, where logits are due.
    part(&mut j, &[], 8);
    drop(j);
    let (mut j, saved) = Journal::open(&path, &eight, 2).unwrap();
    let saved = saved.expect("two prompt parts");
    assert_eq!((saved.position, saved.tokens.len(), saved.logits.len()), (5, 0, 0));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
    append(&mut j, &[10], 9);
    let good = std::fs::metadata(&path).unwrap().len();
    part(&mut j, &[10], 10);
    drop(j);
    let (_, saved) = Journal::open(&path, &eight, 2).unwrap();
    let saved = saved.unwrap();
    assert_eq!((saved.position, saved.tokens, saved.logits), (9, vec![10], vec![1.0; 5]));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "no prompt part after a token");
}

#[test]
fn records_replay_into_the_state_saved_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut j, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert!(saved.is_none());
    append(&mut j, &[10], 4);
    append(&mut j, &[10, 11, 12], 6);
    let good = std::fs::metadata(&path).unwrap().len();
    append(&mut j, &[10, 11, 12, 13], 7);
    drop(j);
    // A write torn half-way through the last record.
    let full = std::fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(good + (full - good) / 2).unwrap();
    drop(f);

    let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
    let saved = saved.expect("the first two records");
    assert_eq!(saved.tokens, vec![10, 11, 12]);
    assert_eq!(saved.sampler_position, 21);
    assert_eq!(saved.logits, vec![3.0; 5]);
    assert_eq!(j.saved(), (3, 6));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "the torn record is cut off");
    let all = rows(0, 4).into_iter().zip(rows(4, 6));
    assert_eq!(saved.position, 6);
    for (snapshot, ((k0, v0), (k1, v1))) in saved.kv.iter().zip(all) {
        let LayerSnapshot::Rows(k, v) = snapshot else { panic!("attention layers restore rows") };
        let want_k = Tensor::cat(&[&k0, &k1], 2).unwrap();
        let want_v = Tensor::cat(&[&v0, &v1], 2).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(k), flat(&want_k));
        assert_eq!(flat(v), flat(&want_v));
    }
}

#[test]
fn a_flipped_byte_ends_the_replay_at_the_record_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
    append(&mut j, &[10], 4);
    let first = std::fs::metadata(&path).unwrap().len() as usize;
    append(&mut j, &[10, 11], 5);
    drop(j);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[first + RECORD_FIXED + 3] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert_eq!(saved.unwrap().tokens, vec![10]);
}

#[test]
fn a_checkpoint_of_another_generation_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
    append(&mut j, &[10], 4);
    drop(j);
    let other = Identity { prompt: vec![1, 2, 4], ..identity() };
    let (j, saved) = Journal::open(&path, &other, 2).unwrap();
    assert!(saved.is_none());
    assert_eq!(j.saved(), (0, 0));
    drop(j);
    // ... and the file now belongs to the new generation.
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert!(saved.is_none());
}

/// Two attempts of one job (the first's lease expired while it still ran) must not append
/// to one journal: the second is refused, and the file is the first's, untouched.
#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut first, _) = Journal::open(&path, &identity(), 2).unwrap();
    append(&mut first, &[10], 4);
    let before = std::fs::read(&path).unwrap();
    // Even one for another generation, which would otherwise start the file over.
    let other = Identity { prompt: vec![9], ..identity() };
    let Err(e) = Journal::open(&path, &other, 2) else { panic!("a second writer opened the checkpoint") };
    assert!(matches!(e, EngineError::CheckpointBusy { .. }), "{e}");
    assert!(e.to_string().contains("being written by another generation"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "the refused writer changed the file");
    append(&mut first, &[10, 11], 5);
    drop(first);
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert_eq!(saved.unwrap().tokens, vec![10, 11]);
}

/// Set in the child process that [`a_failed_append_is_cut_back_to_the_last_whole_record`]
/// starts, to the directory it works in.
const FSIZE_CHILD: &str = "NIGHTMAIL_TEST_FSIZE_CHILD";

/// A write that fails half-way (here: past `RLIMIT_FSIZE`, which writes what fits and then
/// fails with `EFBIG`, as a full disk does) must not leave a torn record for the next ones to
/// follow. The limit is a process's, so the test runs in a child: this test binary again,
/// filtered to this test.
#[test]
fn a_failed_append_is_cut_back_to_the_last_whole_record() {
    if let Some(dir) = std::env::var_os(FSIZE_CHILD) {
        return failed_append_in_child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let name = concat!(module_path!(), "::a_failed_append_is_cut_back_to_the_last_whole_record");
    let name = name.split_once("::").unwrap().1;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(FSIZE_CHILD, dir.path())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("1 passed"), "the child ran no test: {log}");
}

fn failed_append_in_child(dir: &Path) {
    let path = dir.join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
    append(&mut j, &[10], 4);
    let good = std::fs::metadata(&path).unwrap().len();
    assert_eq!(j.bytes(), good);
    let set_limit = |soft: libc::rlim_t| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: plain libc calls on a valid rlimit; the signal is ignored so that a write
        // past the limit fails with EFBIG instead of killing the process.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim), 0);
            lim.rlim_cur = soft.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
    };
    // Room for a part of the next record only.
    set_limit((good + 40) as libc::rlim_t);
    let logits = vec![2.0; 5];
    let kv = rows(4, 5).into_iter().map(|(k, v)| LayerSnapshot::Rows(k, v)).collect();
    let delta = Delta { tokens: &[10, 11], sampler_position: 14, kv, end_position: 5, logits: &logits };
    let Err(e) = j.append(&delta) else { panic!("the append past RLIMIT_FSIZE succeeded") };
    assert!(e.to_string().contains("job.ckpt"), "{e}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "the torn record was left in the file");
    assert_eq!((j.bytes(), j.saved()), (good, (1, 4)));

    // Space again: the next append follows the last whole record and is replayed.
    set_limit(libc::RLIM_INFINITY);
    append(&mut j, &[10, 11, 12], 6);
    drop(j);
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert_eq!(saved.expect("both records").tokens, vec![10, 11, 12]);
}

/// The same path and shape with other weights (re-downloaded, re-quantized, edited) is
/// another model: its size, mtime or header digest tells.
#[test]
fn a_checkpoint_of_other_weights_at_the_same_path_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, [b"GGUF".as_slice(), &[7u8; 4096]].concat()).unwrap();
    let with_weights = || Identity { weights: WeightsFile::of(&model).unwrap(), ..identity() };
    let path = dir.path().join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &with_weights(), 2).unwrap();
    append(&mut j, &[10], 4);
    drop(j);
    let (j, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
    assert_eq!(saved.expect("the same weights resume").tokens, vec![10]);
    drop(j);

    // One byte of the header changed, with the size and mtime as they were.
    let f = OpenOptions::new().write(true).open(&model).unwrap();
    let mtime = f.metadata().unwrap().modified().unwrap();
    f.write_all_at(b"X", 10).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(with_weights().weights[0].modified, identity_modified(&mtime));
    let (mut j, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
    assert!(saved.is_none(), "a checkpoint of another header was resumed");
    append(&mut j, &[20], 4);
    drop(j);

    // Only the mtime changed (a copy without -p, or a rewrite of the same bytes).
    let f = OpenOptions::new().write(true).open(&model).unwrap();
    f.set_modified(mtime + std::time::Duration::from_secs(5)).unwrap();
    drop(f);
    let (_, saved) = Journal::open(&path, &with_weights(), 2).unwrap();
    assert!(saved.is_none(), "a checkpoint of weights with another mtime was resumed");
}

fn identity_modified(t: &std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[test]
fn garbage_is_not_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    std::fs::write(&path, b"NMRESUME\x01\x00\x00\x00\xff\xff\xff\xffnonsense").unwrap();
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    assert!(saved.is_none());
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// A recurrent layer's state `[1, 1, 3, 4]` and `[1, 2, 4, 4]` filled with `x`.
fn state(x: f32) -> LayerSnapshot {
    LayerSnapshot::State(
        Tensor::full(x, (1, 1, 3, 4), &Device::Cpu).unwrap(),
        Tensor::full(-x, (1, 2, 4, 4), &Device::Cpu).unwrap(),
    )
}

#[test]
fn a_recurrent_layer_restores_its_latest_state_beside_an_attention_layers_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
    for (tokens, from, to, x) in [(&[10u32][..], 0, 4, 1.0), (&[10, 11][..], 4, 5, 2.0)] {
        let (k, v) = rows(from, to).remove(0);
        let kv = vec![LayerSnapshot::Rows(k, v), state(x)];
        j.append(&Delta { tokens, sampler_position: 0, kv, end_position: to, logits: &[0.5] }).unwrap();
    }
    drop(j);
    let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
    let saved = saved.unwrap();
    assert_eq!((saved.position, j.saved()), (5, (2, 5)));
    let LayerSnapshot::Rows(k, _) = &saved.kv[0] else { panic!("layer 0 holds rows") };
    assert_eq!(k.dims(), [1, 2, 5, 3], "the rows of both records, appended");
    let LayerSnapshot::State(conv, recurrent) = &saved.kv[1] else { panic!("layer 1 holds a state") };
    assert_eq!((conv.dims(), recurrent.dims()), ([1, 1, 3, 4].as_slice(), [1, 2, 4, 4].as_slice()));
    assert!(flat(conv).iter().all(|x| *x == 2.0) && flat(recurrent).iter().all(|x| *x == -2.0), "the latest state");
}

#[test]
fn a_version_1_file_without_layer_kinds_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    // Version 1's header and one record: the same fields, no kind byte before each layer.
    let id = serde_json::to_vec(&identity()).unwrap();
    let mut file = Vec::new();
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&(id.len() as u32).to_le_bytes());
    file.extend_from_slice(&id);
    file.extend_from_slice(&crc32fast::hash(&file).to_le_bytes());
    let mut p = Vec::new();
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&10u32.to_le_bytes());
    p.extend_from_slice(&7u128.to_le_bytes());
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&4u64.to_le_bytes());
    for (k, v) in rows(0, 4) {
        put_tensor(&mut p, &k).unwrap();
        put_tensor(&mut p, &v).unwrap();
    }
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&0.25f32.to_le_bytes());
    file.extend_from_slice(RECORD);
    file.extend_from_slice(&(p.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    file.extend_from_slice(&p);
    std::fs::write(&path, &file).unwrap();
    let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
    let saved = saved.expect("a version 1 record");
    assert_eq!((saved.tokens, saved.sampler_position, saved.position), (vec![10], 7, 4));
    assert_eq!(j.saved(), (1, 4));
    for (got, (k, _)) in saved.kv.iter().zip(rows(0, 4)) {
        let LayerSnapshot::Rows(got, _) = got else { panic!("version 1 holds rows") };
        assert_eq!(flat(got), flat(&k));
    }
    // Resumed after an upgrade, the generation goes on in the file's own layout.
    let mut j = j;
    append(&mut j, &[10, 11], 6);
    drop(j);
    let (_, saved) = Journal::open(&path, &identity(), 2).unwrap();
    let saved = saved.unwrap();
    assert_eq!((saved.tokens, saved.position), (vec![10, 11], 6));
}

#[test]
fn replaced_recurrent_states_are_compacted_away_and_the_state_survives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.ckpt");
    let (mut j, _) = Journal::open(&path, &identity(), 2).unwrap();
    let mut tokens = Vec::new();
    let (mut compactions, mut appended) = (0, j.bytes());
    for step in 0..40usize {
        tokens.push(step as u32);
        let (from, to) = (j.saved().1, step + 1);
        let all = |from: usize| -> Vec<LayerSnapshot> {
            // Row values that depend on the position alone, so any split concatenates alike.
            let values: Vec<f32> = (0..2)
                .flat_map(|h| (from..to).flat_map(move |p| (0..3).map(move |d| (p * 100 + h * 10 + d) as f32)))
                .collect();
            let k = Tensor::from_vec(values, (1, 2, to - from, 3), &Device::Cpu).unwrap();
            let v = k.neg().unwrap();
            // A recurrent state far larger than a token's rows, as KDA's is.
            let x = step as f32;
            let conv = Tensor::full(x, (1, 1, 3, 16), &Device::Cpu).unwrap();
            let s = Tensor::full(-x, (1, 4, 16, 16), &Device::Cpu).unwrap();
            vec![LayerSnapshot::Rows(k, v), LayerSnapshot::State(conv, s)]
        };
        let delta =
            Delta { tokens: &tokens, sampler_position: step as u128, kv: all(from), end_position: to, logits: &[1.0] };
        let before = j.bytes();
        j.append(&delta).unwrap();
        appended += j.bytes() - before;
        if j.wants_compaction() {
            j.compact(&Delta { kv: all(0), ..delta }).unwrap();
            compactions += 1;
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), j.bytes());
        // Never more than twice what the live state needs (plus the record just added).
        assert!(j.bytes() <= 2 * (j.bytes() - j.superseded) + 1024, "step {step}: {} bytes", j.bytes());
    }
    assert!(compactions >= 2, "{compactions} compactions");
    assert!(j.bytes() * 4 < appended, "{} bytes kept of {appended} appended", j.bytes());
    // The file compaction renamed into place is locked as the old one was.
    assert!(matches!(Journal::open(&path, &identity(), 2), Err(EngineError::CheckpointBusy { .. })));
    drop(j);
    let (j, saved) = Journal::open(&path, &identity(), 2).unwrap();
    let saved = saved.unwrap();
    assert_eq!((saved.tokens.len(), saved.position, saved.sampler_position, j.saved()), (40, 40, 39, (40, 40)));
    let LayerSnapshot::Rows(k, _) = &saved.kv[0] else { panic!("rows") };
    let want: Vec<f32> =
        (0..2).flat_map(|h| (0..40).flat_map(move |p| (0..3).map(move |d| (p * 100 + h * 10 + d) as f32))).collect();
    assert_eq!(flat(k), want, "every position's rows, across compactions");
    let LayerSnapshot::State(conv, _) = &saved.kv[1] else { panic!("a state") };
    assert!(flat(conv).iter().all(|x| *x == 39.0), "the latest state");
}
