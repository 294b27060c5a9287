//! A real `smolvm serve` from the pinned engine that scripts/fetch-smolvm.sh unpacks, on a Unix
//! socket in a temp dir, with its own state dir and guest-rollout port so it never meets another
//! serve on the host. Killed when dropped.

use smol_mcp::fleet::transport::LocalEndpoint;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The engine release the tests run, which is not a spec file name: the spec the clients are
/// generated from is `smol_mcp::spec::LOCAL_API`, and a bump moves both.
pub const PINNED_SMOLVM: &str = "1.32.2";

/// The engine binary: `$SMOLVM_BIN`, else `.smolvm/<pinned>/smol-vmm`. A missing binary fails
/// the test (it is not skipped): `scripts/fetch-smolvm.sh` installs it.
pub fn smolvm_binary() -> PathBuf {
    let path = std::env::var_os("SMOLVM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(".smolvm")
                .join(PINNED_SMOLVM)
                .join("smol-vmm")
        });
    assert!(
        path.exists(),
        "no smolvm engine at {}: run scripts/fetch-smolvm.sh first",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether process `pid` holds a socket listening on TCP `port` (IPv4, /proc/net/tcp and the
/// process's descriptors). A port [`free_port`] found is free only when it is asked: another
/// listener may take it before the server binds it, and a client that connects then reaches
/// that other listener (seen: a restarted server's record read before it had started).
pub fn listening(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            let inode = fields.get(9)?;
            // 0A: LISTEN.
            (local_port == port && *fields.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    descriptors
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

pub struct RealServe {
    child: Child,
    pub dir: tempfile::TempDir,
    pub endpoint: LocalEndpoint,
}

impl RealServe {
    pub async fn start() -> RealServe {
        Self::start_with(None, false).await
    }

    /// A serve listening on a given socket path (its state still in its own temp dir).
    pub async fn start_at(socket: &Path) -> RealServe {
        Self::start_with(Some(socket.to_path_buf()), false).await
    }

    /// A serve that logs every request it serves (method, path, status: `RUST_LOG=debug`),
    /// read back with [`RealServe::log`]: the engine's own witness of what reached it.
    pub async fn start_logging_requests() -> RealServe {
        Self::start_with(None, true).await
    }

    /// The serve's socket.
    pub fn socket(&self) -> PathBuf {
        match &self.endpoint {
            LocalEndpoint::Unix(path) => path.clone(),
            other => panic!("not a socket: {other:?}"),
        }
    }

    /// What the serve has written to its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// Kills the serve (its connections die with it).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn start_with(socket: Option<PathBuf>, log_requests: bool) -> RealServe {
        let dir = tempfile::Builder::new()
            .prefix("smolvm-it-")
            .tempdir()
            .unwrap();
        let socket = socket.unwrap_or_else(|| dir.path().join("api.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut command = Command::new(smolvm_binary());
        command
            .arg("serve")
            .arg("start")
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--guest-rollout-port")
            .arg(free_port().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap());
        if log_requests {
            command.env("RUST_LOG", "debug");
        }
        if is_root() {
            // The engine drops guest processes to another uid unless told not to; as root in a
            // container that uid cannot reach the state dir.
            command.env("SMOLVM_VM_UID_DROP", "off");
        }
        let child = command.spawn().unwrap();
        let endpoint = LocalEndpoint::Unix(socket);
        let serve = RealServe {
            child,
            dir,
            endpoint,
        };
        serve.wait_healthy().await;
        serve
    }

    async fn wait_healthy(&self) {
        let fleet = smol_mcp::fleet::LocalFleet::new(self.endpoint.clone()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if fleet.health().await.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "smolvm serve did not answer /health within 30 s; its log:\n{}",
                std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RealServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
