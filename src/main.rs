use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use gds_csi::gds::gate::{GateConfig, GdsGate};
use gds_csi::metrics::PoolGauges;
use gds_csi::os::RealHost;
use gds_csi::os::TimedHost;
use gds_csi::pool::{Pool, PoolConfig};
use gds_csi::runtime::config::{Cli, Command, DiscoverArgs, LogFormat, PoolCommand, ServeArgs};
use gds_csi::service::server;
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

/// The GDS gate; its cuFile probe runs as a child of this same binary, and its compat
/// marks are kept in the state dir.
fn gds_gate(args: &ServeArgs) -> Result<GdsGate, String> {
    let config = GateConfig {
        paths: args
            .gds
            .host_paths(&args.host_proc, &args.host_sys, &args.host_dev),
        probe_exe: std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into()),
        probe_prefix: gds_csi::gds::doctor::probe_prefix(),
        cufile_library: args.gds.cufile_library.clone(),
        probe_timeout: args.gds.probe_timeout,
        cache_ttl: args.gds_cache_ttl,
    };
    GdsGate::open(config, &args.state_dir).map_err(|e| e.to_string())
}

/// Raises the soft limit on open files to the hard limit: every connection and every
/// child's pipes cost descriptors, and a container's soft limit can be as low as 1024.
fn raise_nofile_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => info!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => warn!(soft, hard, error = %e, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot read the open-file limit"),
    }
}

/// The driver of `serve`: the pool, the GDS gate and the NFS store over the real host,
/// whose operations are timed for metrics by a wrapper around it.
fn build_driver(args: &ServeArgs) -> Result<Driver, String> {
    let host = Arc::new(TimedHost::new(RealHost {
        command_timeout: args.command_timeout,
        mount_timeout: args.mount_timeout,
    }));
    let pool = Pool::open(PoolConfig {
        node_id: args.node_id.clone(),
        host_sys: args.host_sys.clone(),
        host_dev: args.host_dev.clone(),
        listed: args.pool_devices.clone(),
        nvme_discover: args.nvme_discover,
        state_dir: args.state_dir.clone(),
    })
    .map_err(|e| e.to_string())?;
    let nfs = gds_csi::volume::nfs::NfsStore::open(&args.state_dir, args.mount_timeout)
        .map_err(|e| e.to_string())?;
    let snapshots = gds_csi::snapshot::Snapshots::open(&args.state_dir)
        .map_err(|e| e.to_string())?
        .with_freeze_limit(args.snapshot_freeze_limit)
        .with_stall_limit(args.snapshot_stall_limit);
    Ok(Driver::new(
        args.driver.name.clone(),
        args.node_id.clone(),
        args.allowed_path_roots.clone(),
        pool,
        host,
    )
    .with_gds_gate(gds_gate(args)?)
    .with_nfs(nfs)
    .with_snapshots(snapshots))
}

/// `gds-csi pool discover`: the pool's verdict on every device, printed.
async fn discover(args: &DiscoverArgs) -> Result<(), String> {
    let host = RealHost {
        command_timeout: args.command_timeout,
        mount_timeout: args.command_timeout,
    };
    let config = PoolConfig {
        node_id: "discover".to_owned(),
        host_sys: args.host_sys.clone(),
        host_dev: args.host_dev.clone(),
        listed: args.pool_devices.clone(),
        nvme_discover: args.nvme_discover,
        state_dir: args.state_dir.clone(),
    };
    let found = gds_csi::pool::discover::discover(config, &host).await?;
    if args.json {
        let text = serde_json::to_string_pretty(&found).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", gds_csi::pool::discover::render(&found));
    }
    Ok(())
}

/// How often the device plugin looks for a restarted kubelet and re-reads the pieces it
/// hands out: a new kubelet finds the plugin registered again within this.
const WORKLOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// Deadline of each call to the kubelet. Its Register dials the plugin back with a 10 s
/// deadline of its own (devicemanager plugin/v1beta1/client.go:127-138) before answering.
const WORKLOAD_KUBELET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Resolves at SIGTERM or SIGINT, after setting `asked`: the server then drains and `serve`
/// exits 0, which it must not do when the server stops on its own.
fn on_signal(asked: Arc<AtomicBool>) -> Result<impl std::future::Future<Output = ()>, String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        asked.store(true, Ordering::SeqCst);
        info!("signal received; draining in-flight calls");
    })
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    args.validate()?;
    #[cfg(feature = "fault-injection")]
    gds_csi::runtime::faults::arm(args.fault_kill_at);
    let socket = args.socket_path()?;
    raise_nofile_limit();
    // Before anything reads the state: one process per state dir. A predecessor still
    // exiting is waited for; the socket check below then gets what is left of the wait.
    let started = Instant::now();
    let _state_lock = gds_csi::runtime::state_dir::lock(&args.state_dir, args.state_lock_wait)?;
    let driver = Arc::new(build_driver(&args)?);
    let listener = gds_csi::os::socket::bind_after(
        &socket,
        args.socket_mode,
        args.state_lock_wait.saturating_sub(started.elapsed()),
    )
    .map_err(|e| format!("--endpoint {}: {e}", args.endpoint))?;
    info!(endpoint = %args.endpoint, mode = ?args.mode, node_id = %args.node_id, version = env!("CARGO_PKG_VERSION"), "serving");

    spawn_initialisation(&driver);
    spawn_readiness_watch(&args, &driver);
    let workload = spawn_device_plugin(&args, &driver);
    let gauges: Arc<dyn PoolGauges> = driver.clone();
    gds_csi::metrics::start(&args.metrics_address, Some(gauges), args.host_proc.clone()).await?;

    let asked = Arc::new(AtomicBool::new(false));
    let shutdown = on_signal(Arc::clone(&asked))?;
    let result = server::serve(listener, driver, args.mode, shutdown).await;
    let _ = std::fs::remove_file(&socket);
    if let Some(workload) = workload {
        workload.stop();
    }
    result.map_err(|e| e.to_string())?;
    // Exit 0 means "asked to stop": anything else must fail so that it is restarted.
    if !asked.load(Ordering::SeqCst) {
        error!("the gRPC server stopped without a signal");
        return Err("the gRPC server stopped without being asked to".into());
    }
    info!("stopped");
    Ok(())
}

/// Scans the pool in the background: Probe reports not-ready until it has been scanned.
fn spawn_initialisation(driver: &Arc<Driver>) {
    let init = Arc::clone(driver);
    tokio::spawn(async move {
        if let Err(e) = init.initialise().await {
            error!(error = %e, "pool initialisation failed; Probe stays not ready");
        }
    });
}

/// Watches the node's GDS readiness for its topology labels (a node with a GDS gate).
fn spawn_readiness_watch(args: &ServeArgs, driver: &Driver) {
    if args.mode != gds_csi::runtime::config::Mode::Controller {
        if let Some(gate) = driver.gds_gate.clone() {
            gds_csi::gds::readiness::spawn(
                gate,
                gds_csi::gds::readiness::WatchConfig {
                    interval: args.readiness_interval,
                    registration_socket: args.registration_socket.clone(),
                },
            );
        }
    }
}

/// The GDS device plugin, when `--gds-device-plugin` asks for it; its `gds` resource is
/// healthy only while the gate's node checks pass.
fn spawn_device_plugin(
    args: &ServeArgs,
    driver: &Driver,
) -> Option<gds_csi::gds::workload::Running> {
    let node_gds = driver.gds_gate.clone().map(|gate| {
        let check: gds_csi::gds::workload::NodeGds = Arc::new(move || gate.node_not_ready());
        check
    });
    args.gds_device_plugin.then(|| {
        gds_csi::gds::workload::spawn(
            gds_csi::gds::workload::Config {
                driver_name: args.driver.name.clone(),
                plugin_dir: args.device_plugin_dir.clone(),
                host_dev: args.host_dev.clone(),
                udev_data_dir: args.gds.udev_data_dir.clone(),
                cufile_json: args.gds.cufile_json.clone(),
                out_dir: gds_csi::gds::workload::out_dir(&args.state_dir),
                shares: args.gds_device_shares,
                interval: WORKLOAD_INTERVAL,
                kubelet_timeout: WORKLOAD_KUBELET_TIMEOUT,
            },
            node_gds,
        )
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => {
            init_logging(args.log_format);
            serve(*args).await
        }
        Command::Doctor(args) => {
            let code = match &args.pod {
                Some(pod) => gds_csi::gds::doctor::pod::doctor(&args, pod),
                None => gds_csi::gds::doctor::main(&args),
            };
            return ExitCode::from(code as u8);
        }
        Command::WorkloadRead(args) => {
            let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
            let prefix = gds_csi::gds::doctor::probe_prefix();
            return ExitCode::from(gds_csi::gds::doctor::read::main(&args, &exe, &prefix) as u8);
        }
        Command::Populate(args) => gds_csi::volume::populate::main(&args).await,
        Command::Pool(PoolCommand::Discover(args)) => discover(&args).await,
        Command::Probe { endpoint, timeout } => {
            let socket = endpoint.strip_prefix("unix://").unwrap_or(&endpoint);
            match gds_csi::csi::Clients::connect_ready(socket.as_ref(), timeout).await {
                Ok(_) => return ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gds-csi probe: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Command::CufileProbe { args } => {
            std::process::exit(gds_csi::gds::doctor::probe_child(&args))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gds-csi: {e}");
            ExitCode::FAILURE
        }
    }
}
