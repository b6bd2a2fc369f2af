//! The `model` commands' reports as text.

pub(super) fn print_batch_bench(r: &crate::bench::BatchReport) {
    println!("{} steps per batch size; disk {:.2} GB/s; {} experts, top {}", r.tokens, r.disk_gbps, r.experts, r.top_k);
    println!(
        "batch  s/step  tokens/s  speedup  union bound  experts/layer/step  disk/step  (dense)  measured/floor  hit rate"
    );
    for p in &r.points {
        println!(
            "{:>5}  {:>6.3}  {:>8.3}  {:>7.2}  {:>11.2}  {:>18.1}  {:>9}  {:>7}  {:>14.2}  {:>7.1}%",
            p.batch,
            p.s_per_step,
            p.tokens_per_s,
            p.speedup,
            p.union_bound_speedup,
            p.experts_per_layer_step,
            bytes(p.disk_bytes_per_step as u64),
            bytes(p.dense_disk_bytes_per_step as u64),
            p.ratio_to_floor,
            100.0 * p.hit_rate
        );
    }
}

pub(super) fn print_prefill_bench(r: &crate::bench::PrefillReport) {
    println!(
        "prefill    {} tokens in {} passes of {}: {:.3} s ({:.1} tokens/s)",
        r.prefill_tokens,
        r.prefill_passes,
        r.prefill_chunk,
        r.prefill_s,
        r.prefill_tokens as f64 / r.prefill_s.max(1e-9)
    );
    println!(
        "read       {} from disk ({} experts: the expert bank {:.2} times); disk {:.2} GB/s",
        bytes(r.prefill_disk_bytes),
        bytes(r.prefill_expert_disk_bytes),
        r.expert_bank_reads,
        r.disk_gbps
    );
    println!("I/O floor  {:.3} s; resident {:.3} s", r.prefill_io_floor_s, r.prefill_resident_s);
    println!("ratio      prefill / max(floor, resident) = {:.2}", r.ratio_to_bound);
}

pub(super) fn print_join_bench(r: &crate::bench::JoinReport) {
    println!(
        "decode     batch {}: {:.3} s/step alone ({:.2} tokens/s)",
        r.batch, r.decode_s_per_step, r.decode_tokens_per_s
    );
    println!(
        "joined     a {}-token prompt in {} passes of {}: {:.3} s/step ({:.2} tokens/s of the batch)",
        r.join_prompt_tokens, r.join_passes, r.join_chunk, r.joined_s_per_step, r.joined_tokens_per_s
    );
    println!("prefill    {:.3} s joined, {:.3} s alone", r.join_prefill_s, r.alone_prefill_s);
}

pub(super) fn print_verify_bench(r: &crate::bench::VerifyReport) {
    println!(
        "{} passes per width in {} rounds; disk {:.2} GB/s; {} experts, top {}",
        r.passes, r.rounds, r.disk_gbps, r.experts, r.top_k
    );
    println!(
        "rows  s/pass  cost ratio  bound  cost/bound  experts/layer/pass  disk/pass  (dense)  s/token at acceptance"
    );
    for p in &r.points {
        let at: Vec<String> = p
            .at_acceptance
            .iter()
            .map(|a| format!("{:.2}: {:.3} ({:.2}x)", a.acceptance, a.s_per_token, a.speedup))
            .collect();
        println!(
            "{:>4}  {:>6.3}  {:>10.2}  {:>5.2}  {:>10.2}  {:>18.1}  {:>9}  {:>7}  {}",
            p.positions,
            p.s_per_pass,
            p.cost_ratio,
            p.bound_ratio,
            p.ratio_to_bound,
            p.experts_per_layer_pass,
            bytes(p.disk_bytes_per_pass as u64),
            bytes(p.dense_disk_bytes_per_pass as u64),
            at.join(", ")
        );
    }
}

pub(super) fn print_bench(r: &crate::bench::BenchReport) {
    println!("tokens          {} (after a {:.2} s prefill)", r.tokens, r.prefill_s);
    println!("s/token         {:.3}", r.s_per_token);
    println!(
        "disk            {:.2} GB/s sequential direct reads (before {:.2}, after {:.2}){}",
        r.disk_gbps,
        r.disk_gbps_before,
        r.disk_gbps_after,
        if r.direct_io { "" } else { ", expert reads buffered (no O_DIRECT here)" }
    );
    println!(
        "disk/token      {} (dense {}, experts {}; experts needed {})",
        bytes(r.disk_bytes_per_token as u64),
        bytes(r.dense_disk_bytes_per_token as u64),
        bytes(r.expert_disk_bytes_per_token as u64),
        bytes(r.expert_bytes_per_token as u64)
    );
    if let Some(budget) = r.memory_budget_bytes {
        println!(
            "memory budget   {}: {} dense layers resident, {} streamed",
            bytes(budget),
            r.resident_layers,
            r.streamed_layers
        );
    }
    if let Some(d) = &r.dense_stats {
        println!(
            "dense stream    waited {:.1}% of the decode for layers ({} of {} asked for), window {}",
            100.0 * d.wait_s / (r.s_per_token * r.tokens.max(1) as f64),
            d.waits,
            d.requests,
            bytes(d.window_budget_bytes)
        );
    }
    // A striped model: each part's disk on its own line.
    if r.disks.len() > 1 {
        for d in &r.disks {
            println!(
                "per disk        {}: {} read, {:.2} GB/s while busy",
                d.path.display(),
                bytes(d.disk_bytes),
                d.busy_gbps
            );
        }
    }
    println!("I/O floor       {:.3} s/token; measured / floor = {:.2}", r.floor_s_per_token, r.ratio_to_floor);
    println!(
        "cache           hit rate {:.1}%, prefetch hits {:.1}%, budget {}",
        100.0 * r.hit_rate,
        100.0 * r.prefetch_hit_rate,
        bytes(r.cache_budget_bytes)
    );
    println!("prefetch recall {:.1}%", 100.0 * r.prefetch_recall);
    println!("read amplif.    {:.3}", r.read_amplification);
    println!(
        "disk busy       {:.1}% of the decode, reading at {:.2} GB/s while busy",
        100.0 * r.disk_busy_fraction,
        r.busy_read_gbps
    );
    let split = if r.rss.split {
        format!("anonymous {}, file {}", bytes(r.rss.rss_anon_bytes), bytes(r.rss.rss_file_bytes))
    } else {
        "no anonymous/file split on this system".into()
    };
    println!(
        "memory          RSS {} (peak {}; {split}), dense weights {}",
        bytes(r.rss.rss_bytes),
        bytes(r.rss.rss_peak_bytes),
        bytes(r.dense_bytes)
    );
    let distinct: Vec<String> = r.distinct_experts.iter().map(|(_, n)| n.to_string()).collect();
    println!("distinct experts per layer over the timed tokens: {}", distinct.join(" "));
}

pub(super) fn print_plan(r: &crate::plan::PlanReport) {
    let p = &r.plan;
    let layers = p.sizes.layers.len();
    println!(
        "budget          {} (the least that runs: {})",
        bytes(p.budget_bytes as u64),
        bytes(p.minimum_bytes as u64)
    );
    println!(
        "resident        output head and norm {}, key/value cache {}, {} of {layers} dense layers ({})",
        bytes(p.fixed_bytes as u64),
        bytes(p.kv_bytes as u64),
        p.resident_layers.len(),
        bytes(p.resident_layer_bytes as u64)
    );
    let (table, row) = (bytes(p.sizes.embedding_bytes as u64), bytes(p.sizes.embedding_row_bytes as u64));
    if p.sizes.embedding_tied {
        println!("embedding       {table}, the output head's: a token reads one row ({row}) of the head");
    } else {
        println!("embedding       {table} in the file, not resident: a token reads one row ({row}) from it");
    }
    if let Some(m) = &p.sizes.mtp {
        println!(
            "mtp             layer {}: dense {} resident, routed experts {} {}",
            m.layer,
            bytes(p.mtp_bytes as u64),
            bytes(m.expert_bytes as u64),
            if p.experts_resident { "resident" } else { "through the expert cache" }
        );
    }
    if !p.streamed_layers.is_empty() {
        println!(
            "streamed        {} dense layers, read ahead through a window of {}",
            p.streamed_layers.len(),
            bytes(p.window_bytes as u64)
        );
    }
    match (p.experts_resident, p.sizes.cached_expert_bytes()) {
        (_, 0) => {}
        (true, n) => println!("experts         all resident ({})", bytes(n as u64)),
        (false, n) => println!(
            "experts         cache {} of {} (expected hit rate {:.1}%)",
            bytes(p.expert_cache_bytes as u64),
            bytes(n as u64),
            100.0 * r.expert_hit_rate
        ),
    }
    println!(
        "disk/token      {} (dense {}), at {:.2} GB/s{}",
        bytes(r.disk_bytes_per_token as u64),
        bytes(p.dense_disk_bytes_per_token as u64),
        r.disk_gbps,
        if r.disk_measured { " measured here" } else { " given" }
    );
    for k in std::iter::once(&r.dense_kernel).chain(&r.expert_kernel) {
        if k.measured {
            println!(
                "kernel          {} ({}): {:.2} GB/s at batch 1, {:.2} GB/s at batch 8",
                k.tensor, k.dtype, k.gbps_batch1, k.gbps_batch8
            );
        } else {
            println!(
                "kernel          {} ({}): not timed here; the given memory bandwidth, {:.2} GB/s, at every batch",
                k.tensor, k.dtype, k.gbps_batch1
            );
        }
    }
    println!("predicted       {:.3} s/token", r.predicted_s_per_token);
    println!("batch  s/step  disk s  compute s  tokens/s");
    for s in &r.steps {
        println!(
            "{:>5}  {:>6.3}  {:>6.3}  {:>9.3}  {:>8.2}",
            s.batch, s.s_per_step, s.disk_s_per_step, s.compute_s_per_step, s.tokens_per_s
        );
    }
    match r.disk_bound_until_batch {
        Some(b) => println!("the disk stops being the limit at batch {b}"),
        None => println!("the disk stays the limit up to batch 256"),
    }
    if let Some(p) = &r.prefill {
        println!(
            "prefill         {} prompt tokens in {} passes of {}: predicted {:.3} s (a prediction: disk {:.3} s for {}, compute {:.3} s)",
            p.prompt_tokens,
            p.passes,
            p.tokens_per_pass,
            p.predicted_prefill_s,
            p.disk_s,
            bytes(p.disk_bytes as u64),
            p.compute_s
        );
        if !p.compute_measured {
            println!(
                "                a floor: with --mem-gbps the compute is each weight read once per pass, not the \
                 arithmetic of its {} rows (not timed for that machine here)",
                p.tokens_per_pass
            );
        }
    }
}

pub(super) fn print_kernel_bench(r: &crate::kernel_bench::KernelBenchReport) {
    println!(
        "shape           {}x{}, {} token(s) per call, {} matrices ({} of MXFP4)",
        r.rows,
        r.cols,
        r.tokens,
        r.matrices,
        bytes(r.working_set_bytes as u64)
    );
    println!("threads         {} (candle: {})", r.threads, r.candle_threads);
    println!(
        "memory          {:.2} GB/s parallel read (before {:.2}, after {:.2})",
        r.memory_gbps, r.memory_gbps_before, r.memory_gbps_after
    );
    for f in r.mxfp4.iter().chain([&r.candle_q4_0]) {
        let name = if f.kernel.starts_with("candle") { f.kernel.clone() } else { format!("MXFP4 {}", f.kernel) };
        println!(
            "{name:<15} {:.2} GB/s of weights, {:.2} G weights/s, {:.1} µs per call",
            f.gbps, f.gweights_per_s, f.us_per_call
        );
    }
    for f in &r.q4_0_tiles {
        println!(
            "Q4_0 tiles {:<4} {:.2} GB/s of weights, {:.2} G weights/s, {:.1} µs per call, {:.2}x candle Q4_0",
            f.kernel,
            f.gbps,
            f.gweights_per_s,
            f.us_per_call,
            f.gbps / r.candle_q4_0.gbps
        );
    }
    println!("MXFP4 / memory bandwidth      {:.2}", r.mxfp4_to_memory);
    println!("MXFP4 / candle Q4_0 (GB/s)    {:.2}", r.mxfp4_to_candle_q4_0_gbps);
    println!("MXFP4 / candle Q4_0 (speed)   {:.2}", r.mxfp4_to_candle_q4_0_speed);
    for (f, ratio) in r.by_type.iter().zip(&r.by_type_to_q4_0_gbps) {
        println!(
            "{:<15} {:.2} GB/s of weights, {:.2} G weights/s, {:.1} µs per call, {ratio:.2} of Q4_0's GB/s",
            f.kernel, f.gbps, f.gweights_per_s, f.us_per_call
        );
    }
}

pub(super) fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

pub(super) fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
