use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

use gds_csi::config::{Cli, Command, LogFormat, ServeArgs};
use gds_csi::gds_gate::{GateConfig, GdsGate};
use gds_csi::os::RealHost;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::server;
use gds_csi::service::Driver;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The GDS gate; its cuFile probe runs as a child of this same binary.
fn gds_gate(args: &ServeArgs) -> GdsGate {
    GdsGate::new(GateConfig {
        paths: args
            .gds
            .host_paths(&args.host_proc, &args.host_sys, &args.host_dev),
        probe_exe: std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into()),
        probe_prefix: gds_csi::doctor::probe_prefix(),
        cufile_library: args.gds.cufile_library.clone(),
        probe_timeout: args.gds.probe_timeout,
        cache_ttl: args.gds_cache_ttl,
    })
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    args.validate()?;
    gds_csi::faults::arm(args.fault_kill_at);
    let socket = args.socket_path()?;
    let host = Arc::new(RealHost {
        command_timeout: args.command_timeout,
        mount_timeout: args.mount_timeout,
    });
    let pool = Pool::open(PoolConfig {
        node_id: args.node_id.clone(),
        host_sys: args.host_sys.clone(),
        host_dev: args.host_dev.clone(),
        listed: args.pool_devices.clone(),
        nvme_discover: args.nvme_discover,
        state_dir: args.state_dir.clone(),
    })
    .map_err(|e| e.to_string())?;
    let driver = Arc::new(
        Driver::new(
            args.driver_name.clone(),
            args.node_id.clone(),
            args.allowed_path_roots.clone(),
            pool,
            host,
        )
        .with_gds_gate(gds_gate(&args))
        .with_nfs(
            gds_csi::nfs::NfsBackend::open(&args.state_dir, args.mount_timeout)
                .map_err(|e| e.to_string())?,
        ),
    );
    let listener = server::bind(&socket, args.socket_mode)
        .map_err(|e| format!("--endpoint {}: {e}", args.endpoint))?;
    info!(endpoint = %args.endpoint, mode = ?args.mode, node_id = %args.node_id, version = env!("CARGO_PKG_VERSION"), "serving");

    // Probe reports not-ready until the pool has been scanned.
    let init = Arc::clone(&driver);
    tokio::spawn(async move {
        if let Err(e) = init.initialise().await {
            error!(error = %e, "pool initialisation failed; Probe stays not ready");
        }
    });
    gds_csi::metrics::start(
        &args.metrics_address,
        Some(Arc::clone(&driver)),
        args.host_proc.clone(),
    )
    .await?;

    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        info!("signal received; draining in-flight calls");
    };
    let result = server::serve(listener, driver, args.mode, shutdown).await;
    let _ = std::fs::remove_file(&socket);
    result.map_err(|e| e.to_string())?;
    info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => {
            init_logging(args.log_format);
            serve(args).await
        }
        Command::Doctor(args) => return ExitCode::from(gds_csi::doctor::main(&args) as u8),
        Command::CufileProbe { args } => std::process::exit(gds_csi::doctor::probe_child(&args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gds-csi: {e}");
            ExitCode::FAILURE
        }
    }
}
