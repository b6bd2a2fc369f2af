//! Decoding several sequences together ([`Model::step`]): each gets, bit for bit, the logits and
//! tokens it gets alone, whether its experts are resident or streamed, while sequences join
//! (with their prompts prefilled a chunk at a time) and leave between steps.

use std::path::Path;

use nightmail_engine::{GenerateRequest, LoadOptions, MemoryBudget, Model, Prompt, Sampling, StreamConfig};
use nightmail_tools::{SynthArch, SynthDtype, SynthSpec, synth};

/// A small model of the benchmark's kind: Q4_0 experts, F16 dense weights.
fn synth_model(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("moe.gguf");
    let (heads, kv_heads, head_dim) = SynthSpec::default_heads(128);
    let spec = SynthSpec {
        arch: SynthArch::Qwen3Moe,
        layers: 3,
        experts: 16,
        top_k: 4,
        hidden: 128,
        expert_ffn: 64,
        dtype: SynthDtype::Q4_0,
        heads,
        kv_heads,
        head_dim,
        vocab: 512,
        tokenizer_from: None,
        context_length: 256,
        seed: 5,
        dense: None,
    };
    synth(&spec, &path).unwrap();
    path
}

fn request(prompt: Vec<u32>, max_new_tokens: usize, sampling: Sampling) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt));
    r.max_new_tokens = max_new_tokens;
    r.sampling = sampling;
    r.record_logits = true;
    r.stop_at_eos = false;
    r
}

fn prompts() -> Vec<Vec<u32>> {
    vec![(1..20).collect(), vec![7, 8, 9], (100..160).collect(), vec![42]]
}

fn samplings() -> Vec<Sampling> {
    let sampled = Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.9), seed: 3 };
    vec![Sampling::greedy(), sampled, Sampling::greedy(), sampled]
}

type Steps = Vec<(u32, Vec<f32>)>;

/// Sequence `i` alone, through the same step API (prefill chunk 8).
fn alone(model: &Model, prompts: &[Vec<u32>], i: usize) -> Steps {
    let mut s = model.stream_deferred(request(prompts[i].clone(), 12, samplings()[i]), None).unwrap();
    let mut out = Vec::new();
    while s.stop_reason().is_none() {
        for e in model.step(&mut [&mut s], 8).unwrap().into_iter().flatten() {
            out.push((e.id, e.logits.unwrap()));
        }
    }
    out
}

/// All four together, sequence i joining after 2·i steps.
fn together(model: &Model, prompts: &[Vec<u32>]) -> Vec<Steps> {
    together_counted(model, prompts).0
}

/// As [`together`], with the number of model passes the steps ran.
fn together_counted(model: &Model, prompts: &[Vec<u32>]) -> (Vec<Steps>, u64) {
    let mut passes = 0;
    let mut streams: Vec<_> =
        (0..4).map(|i| model.stream_deferred(request(prompts[i].clone(), 12, samplings()[i]), None).unwrap()).collect();
    let mut out = vec![Vec::new(); 4];
    let mut step = 0;
    while streams.iter().any(|s| s.stop_reason().is_none()) {
        let joined = (step / 2 + 1).min(4);
        let mut batch: Vec<_> = streams.iter_mut().take(joined).collect();
        // A step runs a pass if a stream prefills, or draws a token and goes on (runs it).
        let mut ran = batch.iter().any(|s| s.stop_reason().is_none() && s.is_prefilling());
        for (i, e) in model.step(&mut batch, 8).unwrap().into_iter().enumerate() {
            if let Some(e) = e {
                out[i].push((e.id, e.logits.unwrap()));
                ran |= batch[i].stop_reason().is_none();
            }
        }
        passes += u64::from(ran);
        step += 1;
    }
    (out, passes)
}

#[test]
fn sequences_decoded_together_get_exactly_what_they_get_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth_model(dir.path());
    let model = Model::load(&path).unwrap();
    let want: Vec<Steps> = (0..4).map(|i| alone(&model, &prompts(), i)).collect();
    assert!(want.iter().all(|w| w.len() == 12));
    assert_eq!(together(&model, &prompts()), want);

    // Streamed experts through a cache smaller than one layer's: the same bits.
    let mut c = StreamConfig::with_cache_mb(0);
    c.cache_bytes = 4 * 4096;
    let streamed = Model::load_with(&path, &LoadOptions { stream: Some(c), memory: None }).unwrap();
    assert_eq!(together(&streamed, &prompts()), want);
    let stats = streamed.streaming().unwrap().stats();
    assert!(stats.misses > 0, "{stats:?}");
}

#[test]
fn streamed_dense_layers_are_read_once_per_step_for_the_whole_batch() {
    // Issue 17's batching: every dense layer streamed (the window holds one layer) and the
    // expert cache one sequence's step of experts (a quarter of a layer's), four sequences
    // together: each gets the bits it gets alone from the resident model, and each step asks the
    // layer stream for each layer once, whatever the number of sequences in it.
    let dir = tempfile::tempdir().unwrap();
    let path = synth_model(dir.path());
    let want: Vec<Steps> = {
        let model = Model::load(&path).unwrap();
        (0..4).map(|i| alone(&model, &prompts(), i)).collect()
    };
    let layers = 3;
    let ask = |bytes| MemoryBudget {
        bytes,
        kv_tokens: 128,
        batch: 1,
        verify_rows: 1,
        stream_layers: Some((0..layers).collect()),
    };
    let least = nightmail_engine::memory_plan(&path, ask(usize::MAX / 2)).unwrap().minimum_bytes;
    let streamed = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(ask(least)) }).unwrap();
    let plan = streamed.memory_plan().unwrap();
    assert_eq!(plan.streamed_layers.len(), layers, "{plan:?}");
    let cached = plan.expert_cache_bytes / plan.sizes.expert_max_bytes;
    assert!(cached < plan.sizes.experts_per_layer, "the expert cache holds a layer's experts: {plan:?}");
    let (got, passes) = together_counted(&streamed, &prompts());
    assert_eq!(got, want);
    let dense = streamed.dense_stream().unwrap().stats();
    assert_eq!(dense.requests, passes * layers as u64, "one request per layer per step: {dense:?}");
    // Read ahead or on demand, each layer is read at most once per step (none is read for one
    // sequence and again for the next).
    assert!(dense.layer_reads <= dense.requests + layers as u64, "{dense:?}");
    let experts = streamed.streaming().unwrap().stats();
    assert!(experts.misses > 0 && experts.evictions > 0, "{experts:?}");
}

#[test]
fn latent_attention_sequences_decoded_together_get_exactly_what_they_get_alone() {
    // deepseek_v3's cache holds latents: prefill chunks take the plain form, decode steps the
    // absorbed one, and each sequence's latents stay its own. Prompts fit its 64 positions.
    // The fixture is F32, whose matmul (candle's gemm) blocks by the number of rows, so a
    // batch's projections round differently from one sequence's (qwen3_moe's F32 fixture does
    // the same): the tokens must match and the logits agree to 1e-5, not to the bit.
    same_tokens_together_as_alone("deepseek_v3");
}

#[test]
fn sparse_attention_sequences_decoded_together_get_what_they_get_alone() {
    // DSA: each sequence's indexer keys and top-k choice stay its own (F32: 1e-5, as above).
    same_tokens_together_as_alone("deepseek_v32");
    same_tokens_together_as_alone("glm_moe_dsa");
}

#[test]
fn sliding_window_and_sink_sequences_decoded_together_get_what_they_get_alone() {
    // gpt_oss: each sequence's window (5) and sinks apply to its own positions, prompts longer
    // and shorter than the window side by side. F32, so the same 1e-5 as deepseek_v3.
    same_tokens_together_as_alone("gpt_oss");
}

#[test]
fn kda_sequences_decoded_together_each_keep_their_own_recurrent_state() {
    // kimi_linear: each sequence's KDA state and convolution tail are its own; the 40-token
    // prompt joins 32 tokens at a time, so its second chunk starts from the first's state.
    same_tokens_together_as_alone("kimi_linear");
}

#[test]
fn gated_delta_net_sequences_decoded_together_each_keep_their_own_recurrent_state() {
    // qwen3_next: each sequence's DeltaNet states and convolution tails are its own, and its
    // gated attention layer's rows; the 40-token prompt joins in two chunks. F32 like
    // deepseek_v3 (a batch's gemm rounds by its row count), and the fixture's sharpened routers
    // and (1 + w) norms amplify that rounding to 2e-5: the logits agree to the reference's 1e-4.
    same_tokens_together_as_alone_within("qwen3_next", 1e-4);
}

#[test]
fn kimi_k3_sequences_decoded_together_get_what_they_get_alone() {
    // kimi_k3: AttnRes mixes each row (position) on its own, and Stable LatentMoE projects each
    // token's row down and up, so a batch's rows stay apart. F32 like deepseek_v3, and this
    // fixture amplifies rounding (its own chunked and token-by-token prefills differ by 5e-5),
    // so the logits agree to the reference's 1e-4.
    same_tokens_together_as_alone_within("kimi_k3", 1e-4);
}

#[test]
fn deepseek_v4_sequences_decoded_together_each_keep_their_own_window_and_compressors() {
    // deepseek_v4: each sequence's window of keys and compressor states are its own (prompts
    // prefilled 8 at a time, across window and compression boundaries); hyper-connection mixing
    // and hash routing work row by row, each row with its own token id.
    same_tokens_together_as_alone("deepseek_v4");
}

/// A fixture's four sequences decoded together: each gets its tokens alone, logits within 1e-5.
fn same_tokens_together_as_alone(fixture: &str) {
    same_tokens_together_as_alone_within(fixture, 1e-5)
}

fn same_tokens_together_as_alone_within(fixture: &str, tolerance: f32) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(fixture);
    let model = Model::load(&path).unwrap();
    let prompts = vec![(1..20).collect(), vec![7, 8, 9], (100..140).collect(), vec![42]];
    let want: Vec<Steps> = (0..4).map(|i| alone(&model, &prompts, i)).collect();
    assert!(want.iter().all(|w| w.len() == 12));
    for (i, (got, want)) in together(&model, &prompts).iter().zip(&want).enumerate() {
        let ids = |s: &Steps| s.iter().map(|(t, _)| *t).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want), "{fixture} sequence {i}'s tokens");
        for ((_, a), (_, b)) in got.iter().zip(want) {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst < tolerance, "{fixture} sequence {i}: logits differ by {worst:e} in a batch");
        }
    }
}

#[test]
fn a_prompt_prefilled_in_one_chunk_matches_the_plain_stream() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::load(synth_model(dir.path())).unwrap();
    let plain: Vec<u32> =
        model.stream(request(prompts()[0].clone(), 12, Sampling::greedy())).unwrap().map(|e| e.unwrap().id).collect();
    let mut s = model.stream_deferred(request(prompts()[0].clone(), 12, Sampling::greedy()), None).unwrap();
    let mut stepped = Vec::new();
    while s.stop_reason().is_none() {
        stepped.extend(model.step(&mut [&mut s], 64).unwrap().into_iter().flatten().map(|e| e.id));
    }
    assert_eq!(stepped, plain);
}

/// A fixture's 150-token prompt (three of grouped attention's query blocks) run token by token, in passes of 7, in one pass, and in the passes
/// the model's memory sizing picks: the next-token logits agree within `tolerance`, and the
/// answer drawn through [`Model::step`] at that width has the tokens of the token-by-token one.
fn prefill_width_does_not_change_the_result(fixture: &str, least_budget: bool, tolerance: f32) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(fixture);
    // The least budget the model runs in: its experts stream through the smallest cache.
    let memory = least_budget.then(|| {
        let bytes = nightmail_engine::memory_plan(&path, MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
        MemoryBudget { bytes, ..MemoryBudget::mb(0) }
    });
    let model = Model::load_with(&path, &LoadOptions { stream: None, memory }).unwrap();
    assert_eq!(model.streaming().is_some(), least_budget, "{fixture}: experts streamed");
    let prompt: Vec<u32> = (0..150).map(|i| (i * 37 + 11) % 256).collect();
    let sized = model.prefill_chunk(prompt.len());
    let logits = |chunk: usize| model.prefill(&prompt, &mut model.new_cache(), chunk).unwrap();
    let one_by_one = logits(1);
    for chunk in [7, prompt.len(), sized] {
        let worst = logits(chunk).iter().zip(&one_by_one).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < tolerance, "{fixture}: passes of {chunk} differ from token by token by {worst:e}");
    }
    let answer = |chunk: usize| {
        let mut s = model.stream_deferred(request(prompt.clone(), 6, Sampling::greedy()), None).unwrap();
        let mut ids = Vec::new();
        while s.stop_reason().is_none() {
            ids.extend(model.step(&mut [&mut s], chunk).unwrap().into_iter().flatten().map(|e| e.id));
        }
        ids
    };
    assert_eq!(answer(sized), answer(1), "{fixture}: the answer after a prefill in passes of {sized}");
}

#[test]
fn a_moe_prompt_prefilled_in_budget_sized_passes_matches_token_by_token() {
    // qwen3_moe under a budget that streams its experts: each pass groups its tokens by expert
    // (`MoeBlock::forward_routed`). F32 gemm rounds by row count: 1e-5, as the batch tests.
    prefill_width_does_not_change_the_result("qwen3_moe", true, 1e-5);
}

#[test]
fn a_sliding_window_prompt_prefilled_in_wide_passes_matches_token_by_token() {
    // gpt_oss: a pass of 150 rows masks each row to its own window of 5 and its sinks.
    prefill_width_does_not_change_the_result("gpt_oss", false, 1e-5);
}

#[test]
fn recurrent_prompts_prefilled_in_wide_passes_match_token_by_token() {
    // KDA (kimi_k3) and Gated DeltaNet (qwen3_next): a pass runs the delta rule over its chunk
    // from the state the last pass left; the fixtures' sharpened routers amplify rounding, hence
    // their 1e-4 (as the batch tests).
    prefill_width_does_not_change_the_result("kimi_k3", false, 1e-4);
    prefill_width_does_not_change_the_result("qwen3_next", false, 1e-4);
}

/// A model whose expert bank (3 layers of 64 experts of 110 KiB) is several times the union of a
/// wide pass, so that a budget below the bank leaves cache room to lend.
fn synth_wide_bank(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("bank.gguf");
    let (heads, kv_heads, head_dim) = SynthSpec::default_heads(256);
    let spec = SynthSpec {
        arch: SynthArch::Qwen3Moe,
        layers: 3,
        experts: 64,
        top_k: 4,
        hidden: 256,
        expert_ffn: 256,
        dtype: SynthDtype::Q4_0,
        heads,
        kv_heads,
        head_dim,
        vocab: 512,
        tokenizer_from: None,
        context_length: 256,
        seed: 7,
        dense: None,
    };
    synth(&spec, &path).unwrap();
    path
}

/// A long prompt joins a sequence that decodes, under a budget whose cache holds less than the
/// bank: its passes borrow cache room (the cache shrinks while it prefills and is whole again once
/// it decodes), and both sequences get the tokens they get alone, token by token.
#[test]
fn a_long_prompt_borrows_the_expert_cache_while_another_sequence_decodes_in_its_passes() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth_wide_bank(dir.path());
    let prompt: Vec<u32> = (0..200).map(|i| (i * 37 + 11) % 512).collect();
    let short: Vec<u32> = (0..5).map(|i| (i * 13 + 3) % 512).collect();
    // The least budget (in MiB steps) at which the prompt's passes borrow cache room.
    let minimum = nightmail_engine::memory_plan(&path, MemoryBudget::mb(1 << 20)).unwrap().minimum_bytes;
    let budget = (0..64)
        .map(|mb| MemoryBudget { bytes: minimum + (mb << 20), kv_tokens: 256, ..MemoryBudget::mb(0) })
        .find(|b| {
            let plan = nightmail_engine::memory_plan(&path, b.clone()).unwrap();
            let ck = nightmail_formats::ModelFile::open(&path).unwrap();
            let spec = nightmail_model::ModelSpec::read(&ck).unwrap();
            let width = nightmail_engine::prefill_tokens_per_pass(&spec, Some(&plan), prompt.len());
            !plan.experts_resident
                && width < prompt.len()
                && nightmail_engine::cache_bytes_for_pass(&plan, width, prompt.len()) < plan.expert_cache_bytes
        })
        .expect("a budget at which a long prompt borrows cache room");
    let model = Model::load_with(&path, &LoadOptions { stream: None, memory: Some(budget) }).unwrap();
    let store = model.streaming().expect("experts streamed");
    let full = model.memory_plan().unwrap().expert_cache_bytes;
    let chunk = model.prefill_chunk(prompt.len());
    let alone = |tokens: &[u32]| -> Vec<u32> {
        let mut s = model.stream_deferred(request(tokens.to_vec(), 6, Sampling::greedy()), None).unwrap();
        let mut ids = Vec::new();
        while s.stop_reason().is_none() {
            ids.extend(model.step(&mut [&mut s], 1).unwrap().into_iter().flatten().map(|e| e.id));
        }
        ids
    };
    let (want_long, want_short) = (alone(&prompt), alone(&short));
    assert_eq!(store.capacity(), full);
    let mut b = model.stream_deferred(request(short.clone(), 6, Sampling::greedy()), None).unwrap();
    model.step(&mut [&mut b], 8).unwrap();
    let mut a = model.stream_deferred(request(prompt.clone(), 6, Sampling::greedy()), None).unwrap();
    let (mut got_long, mut got_short) = (Vec::new(), Vec::new());
    let mut lent = false;
    while a.stop_reason().is_none() || b.stop_reason().is_none() {
        let prefilling = a.stop_reason().is_none() && a.is_prefilling();
        let events = model.step(&mut [&mut a, &mut b], chunk).unwrap();
        if prefilling && a.is_prefilling() {
            lent |= store.capacity() < full;
        }
        if !a.is_prefilling() {
            assert_eq!(store.capacity(), full, "the cache is whole once the prompt is in");
        }
        let mut events = events.into_iter();
        got_long.extend(events.next().flatten().map(|e| e.id));
        got_short.extend(events.next().flatten().map(|e| e.id));
    }
    assert!(lent, "passes of {chunk} borrowed no cache room");
    assert_eq!(got_long, want_long);
    assert_eq!(got_short, want_short);
}
