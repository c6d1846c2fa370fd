//! The partition harness: every process (a Sluice node, a Redis server, a
//! Sentinel) in a Linux network namespace of its own, joined by a bridge;
//! the test talks to them from the root namespace through the bridge
//! (`10.77.K.1`). [`Net`] creates the namespaces and removes them, with
//! whatever runs in them, when dropped (also on a panic). Faults are
//! functions: [`Net::cut_link`] (the host's link down), [`Net::cut_from`]
//! (blackhole routes in one host to some others only: the test still
//! reaches it), [`Proc::signal`] (SIGKILL, SIGSTOP, SIGCONT).
//!
//! Needs root, `ip` and `redis-server`: [`available`] says why not, and
//! fails instead when `PARTITION_TESTS_REQUIRE` is set (`.ci/run`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether the harness can run here; otherwise prints why and returns
/// false (the test passes, skipped), or panics under
/// `PARTITION_TESTS_REQUIRE`.
pub fn available() -> bool {
    let ok = |prog: &str, arg: &str| {
        Command::new(prog)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let why = if !root {
        Some("not root (network namespaces need it)")
    } else if !ok("ip", "-V") {
        Some("no `ip` command (iproute2)")
    } else if !ok("redis-server", "--version") {
        Some("redis-server is not on PATH")
    } else if !ok("ip", "netns") {
        Some("`ip netns` does not work here")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) => {
            assert!(
                std::env::var_os("PARTITION_TESTS_REQUIRE").is_none(),
                "PARTITION_TESTS_REQUIRE is set but the partition harness cannot run: {why}"
            );
            eprintln!("SKIPPED: partition tests: {why}");
            false
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// One namespace on the bridge.
#[derive(Clone, Debug)]
pub struct Host {
    pub ns: String,
    pub ip: String,
    /// The bridge side of its link.
    veth: String,
}

/// The namespaces, the bridge and a temporary directory; all removed on
/// drop, after killing what still runs in the namespaces.
pub struct Net {
    bridge: String,
    subnet: String,
    tag: String,
    hosts: Vec<Host>,
    pub tmp: tempfile::TempDir,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Net {
    pub fn new() -> Net {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:x}", (pid % 4096) * 16 + n % 16);
        let subnet = format!("10.77.{}", (pid as u32 * 7 + n * 31) % 250 + 2);
        let net = Net {
            bridge: format!("sb{tag}"),
            subnet,
            tag,
            hosts: Vec::new(),
            tmp: tempfile::tempdir().unwrap(),
        };
        ip_quiet(&["link", "del", &net.bridge]);
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &net.bridge,
        ]);
        ip(&["link", "set", &net.bridge, "up"]);
        net
    }

    /// A new namespace on the bridge, at `10.77.K.(10 + i)`.
    pub fn host(&mut self) -> Host {
        let i = self.hosts.len();
        let ns = format!("sluice-{}-{i}", self.tag);
        let veth = format!("sv{}x{i}", self.tag);
        let peer = format!("sp{}x{i}", self.tag);
        let addr = format!("{}.{}", self.subnet, 10 + i);
        ip_quiet(&["netns", "del", &ns]);
        ip(&["netns", "add", &ns]);
        let h = Host {
            ns: ns.clone(),
            ip: addr.clone(),
            veth: veth.clone(),
        };
        // Recorded first: a failure below still removes it.
        self.hosts.push(h.clone());
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", &peer, "netns", &ns,
        ]);
        ip(&["link", "set", &veth, "master", &self.bridge]);
        ip(&["link", "set", &veth, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &peer,
        ]);
        ip(&["-n", &ns, "link", "set", &peer, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        h
    }

    /// `program` to run in `host`'s namespace.
    pub fn command(&self, host: &Host, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.ns, program]);
        c
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Fault: `host`'s link down (nothing reaches it, not even the test).
    pub fn cut_link(&self, host: &Host) {
        ip(&["link", "set", &host.veth, "down"]);
    }

    pub fn heal_link(&self, host: &Host) {
        ip(&["link", "set", &host.veth, "up"]);
    }

    /// Fault: `host` loses the way to each of `others` (blackhole routes
    /// in its namespace: its packets to them are dropped, so neither side
    /// hears the other); the test and the rest still reach it.
    pub fn cut_from(&self, host: &Host, others: &[&Host]) {
        for o in others {
            ip(&[
                "-n",
                &host.ns,
                "route",
                "add",
                "blackhole",
                &format!("{}/32", o.ip),
            ]);
        }
    }

    pub fn heal_from(&self, host: &Host, others: &[&Host]) {
        for o in others {
            ip_quiet(&[
                "-n",
                &host.ns,
                "route",
                "del",
                "blackhole",
                &format!("{}/32", o.ip),
            ]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Whatever still runs there (a process the test leaked).
            if let Ok(out) = Command::new("ip").args(["netns", "pids", &h.ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            ip_quiet(&["netns", "del", &h.ns]);
            ip_quiet(&["link", "del", &h.veth]);
        }
        ip_quiet(&["link", "del", &self.bridge]);
    }
}

/// A process in a namespace, its stderr (and stdout) kept; SIGKILLed on
/// drop.
pub struct Proc {
    child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
    pub name: String,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        for out in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            });
        }
        Proc {
            child: Some(child),
            log,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Fault: a signal (`KILL`, `STOP`, `CONT`, …).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {}", self.name);
    }

    /// SIGTERM, then waits up to `limit` for the process to exit; how
    /// long it took, or `None` (it is then SIGKILLed).
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        self.signal("TERM");
        let started = Instant::now();
        let child = self.child.as_mut()?;
        while started.elapsed() < limit {
            if child.try_wait().ok().flatten().is_some() {
                self.child = None;
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits for a log line holding `what`.
    pub fn wait_log(&self, what: &str, limit: Duration) -> String {
        let started = Instant::now();
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            assert!(
                started.elapsed() < limit,
                "{}: no log line with {what:?} in {limit:?}; log:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli` against `host:port` from the root namespace; its output.
pub fn redis_cli(addr: &str, port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", addr, "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `redis-server` answers PING at `addr:port`.
pub fn wait_redis(addr: &str, port: u16) {
    let started = Instant::now();
    while std::net::TcpStream::connect_timeout(
        &format!("{addr}:{port}").parse().unwrap(),
        Duration::from_millis(200),
    )
    .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "redis at {addr}:{port} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Redis server in `host`, optionally a replica of `primary`. Its
/// directory is the net's: a replica writes the primary's snapshot there
/// (`dump.rdb`), which in the working directory would be loaded by every
/// later `redis-server` started there (tests/cluster.rs's too).
pub fn redis(net: &Net, host: &Host, primary: Option<&Host>) -> Proc {
    let dir: PathBuf = net.dir().join(format!("redis-{}", host.ip));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = net.command(host, "redis-server");
    c.args([
        "--port",
        "6379",
        "--bind",
        &host.ip,
        "--protected-mode",
        "no",
    ])
    .args(["--save", "", "--appendonly", "no"])
    .arg("--dir")
    .arg(&dir);
    if let Some(p) = primary {
        c.args(["--replicaof", &p.ip, "6379"]);
    }
    let p = Proc::spawn(&format!("redis@{}", host.ip), c);
    wait_redis(&host.ip, 6379);
    p
}

/// A Sentinel in `host` watching `primary` as master `sluice` (quorum 2,
/// down after 1 s).
pub fn sentinel(net: &Net, host: &Host, primary: &Host) -> Proc {
    let dir: PathBuf = net.dir().join(format!("sentinel-{}", host.ip));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 26379\nbind {ip}\nprotected-mode no\ndir {dir}\n\
             sentinel monitor sluice {p} 6379 2\n\
             sentinel down-after-milliseconds sluice 1000\n\
             sentinel failover-timeout sluice 4000\n\
             sentinel parallel-syncs sluice 1\n",
            ip = host.ip,
            dir = dir.display(),
            p = primary.ip
        ),
    )
    .unwrap();
    let mut c = net.command(host, "redis-server");
    c.arg(&conf).arg("--sentinel");
    let p = Proc::spawn(&format!("sentinel@{}", host.ip), c);
    wait_redis(&host.ip, 26379);
    p
}

/// A `sluice serve` in `host`, listening on `host.ip:7000`, with `toml`
/// as its config file and a store under the net's directory.
pub fn node(net: &Net, host: &Host, name: &str, toml: &str) -> Proc {
    let dir = net.dir().join(format!("node-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(&file, toml).unwrap();
    let mut c = net.command(host, crate::support::BIN);
    c.arg("serve")
        .arg("--config")
        .arg(&file)
        .env_clear()
        .env("SLUICE_SERVER__LISTEN", format!("{}:7000", host.ip))
        .env("SLUICE_STORE__PATH", dir.join("store"))
        .env("SLUICE_STORE__MAP_SIZE_MB", "256")
        .env("SLUICE_STORE__MIN_FREE_DISK_MB", "64")
        .env("RUST_LOG", "info");
    let p = Proc::spawn(&format!("node {name}"), c);
    p.wait_log("listening on ws://", Duration::from_secs(20));
    p
}
