//! `nightmail serve`: opens the store, binds the listeners, and runs until SIGTERM or SIGINT;
//! SIGHUP reloads the configuration for new sessions (`reload.rs`).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nightmail_config::Config;
use nightmail_store::Store;
use nightmail_types::Timestamp;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// How often leases that nobody renewed are put back in the queue.
const LEASE_SWEEP: Duration = Duration::from_secs(30);
/// How often expired dedupe marks, and finished jobs past `worker.retention_days`, are deleted
/// (by the lease sweeper, at start-up and then so often).
const DEDUPE_SWEEP: Duration = Duration::from_secs(3600);

pub fn run(config: Config) -> anyhow::Result<()> {
    owner_only_umask();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    crate::reload::refuse_demo_password_off_loopback(&config)?;
    let data_dir = &config.data_dir;
    nightmail_store::log_made_private(data_dir, &nightmail_store::make_private(data_dir)?);
    let store = open_store(&config)?;
    let recovered = store.recover_leases(true).await?;
    if recovered > 0 {
        tracing::info!(recovered, "requeued jobs that were running when nightmail last stopped");
    }
    let recovered = store.recover_outbound(true, Timestamp::now()).await?;
    if recovered > 0 {
        tracing::info!(recovered, "requeued outbound mail that was being sent when nightmail last stopped");
    }

    let tls = match &config.tls {
        Some(tls) => Some(nightmail_tls::acceptor(tls, &config.data_dir, &config.hostname)?),
        None => None,
    };
    let smtp = bind(config.smtp.listen, "smtp.listen", &config).await?;
    let smtp_addr = smtp.local_addr()?;
    let imap = bind(config.imap.listen, "imap.listen", &config).await?;
    let imap_addr = imap.local_addr()?;
    // Implicit-TLS listeners (RFC 8314), when configured; the configuration refuses them without [tls].
    let smtps = match (config.smtp.listen_tls, &tls) {
        (Some(addr), Some(acceptor)) => Some((bind(addr, "smtp.listen_tls", &config).await?, acceptor.clone())),
        _ => None,
    };
    let imaps = match (config.imap.listen_tls, &tls) {
        (Some(addr), Some(acceptor)) => Some((bind(addr, "imap.listen_tls", &config).await?, acceptor.clone())),
        _ => None,
    };
    let control = crate::control::bind(&config.data_dir)?;

    let config = Arc::new(config);
    let relay = nightmail_relay::Relay::new(store.clone(), config.clone())
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.source_name()))?;
    let mut bridges = Vec::new();
    for bridge in &config.bridges {
        let b = nightmail_bridge::Bridge::new(store.clone(), config.clone(), bridge)
            .map_err(|e| anyhow::anyhow!("{}: bridge {}: {e}", config.source_name(), bridge.address))?;
        bridges.push(b);
    }
    // What new sessions start with; SIGHUP replaces it (`reload.rs`).
    let (mut live, (shared, imap_shared, setup)) = crate::reload::Live::new(config.clone(), store.clone(), tls);
    let (stop_tx, stop_rx) = watch::channel(false);

    let mut implicit = Vec::new();
    let mut implicit_addrs = Vec::new();
    if let Some((listener, acceptor)) = smtps {
        implicit_addrs.push(("smtps", listener.local_addr()?));
        let wrap = nightmail_smtp::Wrap::ImplicitTls(acceptor);
        implicit.push(tokio::spawn(nightmail_smtp::serve(listener, shared.clone(), stop_rx.clone(), wrap)));
    }
    if let Some((listener, acceptor)) = imaps {
        implicit_addrs.push(("imaps", listener.local_addr()?));
        let wrap = nightmail_imap::Wrap::ImplicitTls(acceptor);
        implicit.push(tokio::spawn(nightmail_imap::serve(listener, imap_shared.clone(), stop_rx.clone(), wrap)));
    }
    let smtp_task = tokio::spawn(nightmail_smtp::serve(smtp, shared, stop_rx.clone(), nightmail_smtp::Wrap::Plain));
    let imap_task =
        tokio::spawn(nightmail_imap::serve(imap, imap_shared, stop_rx.clone(), nightmail_imap::Wrap::Plain));
    let control_task =
        tokio::spawn(crate::control_server::serve(control, store.clone(), config.data_dir.clone(), stop_rx.clone()));
    let worker = nightmail_worker::Worker::reloading(store.clone(), setup);
    let worker_task = tokio::spawn(worker.run(stop_rx.clone()));
    let relay_task = relay.map(|relay| tokio::spawn(relay.run(stop_rx.clone())));
    let bridge_tasks: Vec<_> = bridges.into_iter().map(|b| tokio::spawn(b.run(stop_rx.clone()))).collect();
    let sweeper = {
        let store = store.clone();
        let retention = config.worker.retention;
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut dedupe_swept: Option<tokio::time::Instant> = None;
            loop {
                if dedupe_swept.is_none_or(|at| at.elapsed() >= DEDUPE_SWEEP) {
                    dedupe_swept = Some(tokio::time::Instant::now());
                    match store.sweep_dedupe().await {
                        Ok(0) => {}
                        Ok(removed) => tracing::info!(removed, "deleted expired dedupe marks"),
                        Err(e) => tracing::error!("dedupe sweep failed: {e}"),
                    }
                    if let Some(keep) = retention {
                        match store.purge_jobs(Timestamp::now().minus(keep)).await {
                            Ok(0) => {}
                            Ok(removed) => tracing::info!(removed, "deleted finished jobs past worker.retention_days"),
                            Err(e) => tracing::error!("job retention sweep failed: {e}"),
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(LEASE_SWEEP) => {}
                    _ = stop.changed() => break,
                }
                if let Err(e) = store.recover_leases(false).await {
                    tracing::error!("lease sweep failed: {e}");
                }
                if let Err(e) = store.recover_outbound(false, Timestamp::now()).await {
                    tracing::error!("outbound lease sweep failed: {e}");
                }
            }
        })
    };

    // Handlers first: once the line below is out, a SIGTERM must mean a clean stop.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP reloads the configuration for new sessions (`reload.rs`); without a handler it would kill.
    let mut hup = signal(SignalKind::hangup())?;
    // Tests and scripts read the bound port from this line (port 0 picks a free one).
    // The implicit-TLS lines come first: the IMAP line is the last one.
    for (name, addr) in &implicit_addrs {
        println!("nightmail: {name} listening on {addr}");
    }
    println!("nightmail: smtp listening on {smtp_addr}");
    println!("nightmail: imap listening on {imap_addr}");
    std::io::stdout().flush().ok();
    tracing::info!(source = %config.source_name(), data = %config.data_dir.display(), "nightmail serving");

    loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM: shutting down");
                break;
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: shutting down");
                break;
            }
            _ = hup.recv() => live.reload(),
        }
    }
    stop_tx.send(true).ok();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = smtp_task.await;
        let _ = imap_task.await;
        for task in implicit {
            let _ = task.await;
        }
        let _ = worker_task.await;
        if let Some(relay_task) = relay_task {
            let _ = relay_task.await;
        }
        for task in bridge_tasks {
            let _ = task.await;
        }
        let _ = control_task.await;
        let _ = sweeper.await;
    })
    .await;
    store.flush().await?;
    crate::control::unlink(&config.data_dir);
    Ok(())
}

/// Everything the daemon writes under `data_dir` (the store and its blobs, the TLS key,
/// checkpoints, the control socket) is for its owner alone, whatever umask it was started with:
/// the systemd unit's `UMask=0077`, held by the daemon itself.
fn owner_only_umask() {
    // SAFETY: umask(2) only sets the process's file mode creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

fn open_store(config: &Config) -> anyhow::Result<Store> {
    let dir = config.data_dir.join("store");
    Store::open_with_cache(&dir, config.store.cache_bytes)
        .with_context(|| format!("opening the store in {} (data_dir in {})", dir.display(), config.source_name()))
}

async fn bind(addr: std::net::SocketAddr, key: &str, config: &Config) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => "is in use by another program",
            std::io::ErrorKind::PermissionDenied => "needs privileges to bind (ports below 1024 need root)",
            _ => "cannot be bound",
        };
        anyhow::anyhow!("{key} = \"{addr}\" {hint} ({e}): set {key} in {} to a free address", config.source_name())
    })
}
