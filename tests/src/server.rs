//! Starts the real `dspark serve` for a test and stops it when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::repo_root;

/// A running server.
pub struct Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    _state: tempfile::TempDir,
}

impl Server {
    /// Starts `binary serve ARGS --port 0` with the built plugins and waits until it listens.
    pub fn start(binary: &Path, args: &[&str]) -> Self {
        crate::builtin_plugin("json-schema");
        Self::start_with_plugins(binary, &repo_root().join("plugins"), args)
    }

    /// [`Server::start`] with another plugin registry directory.
    pub fn start_with_plugins(binary: &Path, plugins: &Path, args: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("state dir");
        let mut child = Command::new(binary)
            .current_dir(repo_root())
            .arg("serve")
            .args(args)
            .args(["--port", "0", "--plugins-dir"])
            .arg(plugins)
            .arg("--state-dir")
            .arg(state.path())
            .env("DSPARK_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dspark serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
                eprintln!("[server] {line}");
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                panic!("dspark serve did not start listening within 120 s (see [server] lines)");
            }
        };
        Self { child, addr, _state: state }
    }
}

impl Server {
    /// Sends the signal `name` (`TERM`, `INT`) to the server process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -s {name} failed");
    }

    /// Waits for the process to exit, at most `within`; its exit status.
    pub fn wait_for_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the server process") {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "dspark serve did not exit within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
