//! The servers Herald is compared with, as targets: the raw one-write-per-
//! frame baseline (this binary's `raw-server`), nginx + nchan, the Python
//! websockets broadcaster and uWebSockets.js, each installed by
//! bench/peers/install.sh when missing.

use super::*;

impl Target {
    /// Starts `bench raw-server` (this binary) as the baseline.
    pub async fn raw() -> anyhow::Result<Target> {
        let exe = std::env::current_exe().context("finding the bench binary")?;
        let dir = TempDir::new("raw-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = dir.path().join("raw.log");
        let mut cmd = Command::new(exe);
        cmd.arg("raw-server").args(["--listen", &addr.to_string()]);
        let child = spawn_logged(&mut cmd, &log, "the raw baseline server")?;
        let mut t = Target {
            kind: Kind::Raw,
            addr,
            publish_addr: addr,
            publish_key: "raw".into(),
            admin: String::new(),
            guard: ChildGuard::new("raw-server", child),
            others: Vec::new(),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        Ok(t)
    }

    /// Starts a peer, installing it first when it is missing.
    pub async fn peer(peer: Peer) -> anyhow::Result<Target> {
        ensure_installed(peer)?;
        match peer {
            Peer::Nchan => Target::nchan().await,
            Peer::Python => Target::python().await,
            Peer::Uws => Target::uws(false).await,
        }
    }

    /// Starts `bench/peers/uws_pubsub.js` (one port for WebSocket and HTTP);
    /// with `deflate`, permessage-deflate with its shared compressor.
    pub async fn uws(deflate: bool) -> anyhow::Result<Target> {
        ensure_installed(Peer::Uws)?;
        let dir = TempDir::new("uws-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = dir.path().join("uws.log");
        let mut cmd = Command::new("node");
        cmd.arg(peers_dir().join("uws_pubsub.js"))
            .args(["--port", &port.to_string()]);
        if deflate {
            cmd.arg("--deflate");
        }
        let child = spawn_logged(&mut cmd, &log, "node uws_pubsub.js")?;
        let mut t = Target {
            kind: Kind::Uws,
            addr,
            publish_addr: addr,
            publish_key: String::new(),
            admin: String::new(),
            guard: ChildGuard::terminating("uwebsockets", child),
            others: Vec::new(),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        Ok(t)
    }

    async fn nchan() -> anyhow::Result<Target> {
        let dir = TempDir::new("nchan-bench")?;
        let port = procs::free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let template = std::fs::read_to_string(peers_dir().join("nchan.conf"))
            .context("reading bench/peers/nchan.conf")?;
        let conf = template
            .replace("@PORT@", &port.to_string())
            .replace("@DIR@", &dir.path().display().to_string());
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let log = dir.path().join("error.log");
        let mut cmd = Command::new(NGINX);
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off;"]);
        let child = spawn_logged(&mut cmd, &dir.path().join("stdout.log"), NGINX)?;
        let mut t = Target {
            kind: Kind::Nchan,
            addr,
            publish_addr: addr,
            publish_key: String::new(),
            admin: String::new(),
            guard: ChildGuard::terminating("nginx", child),
            others: Vec::new(),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        Ok(t)
    }

    async fn python() -> anyhow::Result<Target> {
        let dir = TempDir::new("pyws-bench")?;
        let (ws, http) = (procs::free_port()?, procs::free_port()?);
        let log = dir.path().join("py.log");
        let mut cmd = Command::new("python3");
        cmd.arg(peers_dir().join("py_broadcast.py")).args([
            "--ws-port",
            &ws.to_string(),
            "--http-port",
            &http.to_string(),
        ]);
        let child = spawn_logged(&mut cmd, &log, "python3 py_broadcast.py")?;
        let mut t = Target {
            kind: Kind::Python,
            addr: ([127, 0, 0, 1], ws).into(),
            publish_addr: ([127, 0, 0, 1], http).into(),
            publish_key: String::new(),
            admin: String::new(),
            guard: ChildGuard::terminating("python websockets", child),
            others: Vec::new(),
            log,
            _dir: dir,
        };
        t.wait_ready().await?;
        Ok(t)
    }
}

pub(super) const NGINX: &str = "/usr/sbin/nginx";
pub(super) const NCHAN_MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";

/// Where bench/peers/install.sh puts uWebSockets.js.
pub(super) fn uws_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HERALD_UWS_DIR") {
        return d.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("herald").join("uws")
}

pub(super) fn peers_dir() -> PathBuf {
    crate::report::bench_dir().join("peers")
}

pub(super) fn installed(peer: Peer) -> bool {
    match peer {
        Peer::Nchan => Path::new(NGINX).is_file() && Path::new(NCHAN_MODULE).is_file(),
        Peer::Uws => {
            uws_dir()
                .join("node_modules/@trufflesuite/uws-js-unofficial/package.json")
                .is_file()
                && Command::new("node")
                    .arg("--version")
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
        }
        Peer::Python => Command::new("python3")
            .args(["-c", "import websockets"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
    }
}

/// Installs the peers from Debian and PyPI (`bench/peers/install.sh`) when
/// `peer` is missing.
pub(super) fn ensure_installed(peer: Peer) -> anyhow::Result<()> {
    if installed(peer) {
        return Ok(());
    }
    println!(
        "  {} is not installed; running bench/peers/install.sh",
        Kind::as_str(peer.kind())
    );
    let status = Command::new("bash")
        .arg(peers_dir().join("install.sh"))
        .status()
        .context("running bench/peers/install.sh")?;
    if !status.success() || !installed(peer) {
        bail!(
            "{} is still missing after bench/peers/install.sh ({status})",
            peer.kind().as_str()
        );
    }
    Ok(())
}
