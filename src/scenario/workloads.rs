//! The workloads a VM runs (`workload` / `vm[i].workload`): each
//! workload's table, its defaults and its checks.

use super::{bad, key, require, within, ScenarioError};
use serde::{Deserialize, Serialize};

/// Largest `workload.fio.disk_bytes`: 1 TiB (the RAM disk is not
/// allocated, but offsets stay far from overflow).
pub const MAX_DISK_BYTES: u64 = 1 << 40;

/// Largest `workload.memcached.client_threads` (the paper: 8).
pub const MAX_CLIENT_THREADS: u16 = 1024;

/// Most netperf instances, nginx workers or ab processes per VM.
pub const MAX_INSTANCES: u16 = 64;

/// Most HTTP connections (ab processes × concurrency) per VM.
pub const MAX_HTTP_CONNECTIONS: u32 = 4000;

/// Workloads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// External UDP sender and in-guest receiver.
    pub udp: Option<UdpSpec>,
    /// WhileLoop.
    pub whileloop: Option<WhileLoopSpec>,
    /// cyclictest.
    pub cyclictest: Option<CyclictestSpec>,
    /// The hrtimer latency test (did-implementation.md §6: the authors'
    /// hrtimer module, traced with ftrace): a kernel hrtimer on the VM's
    /// application CPU (a module, no task); latency = its callback's start
    /// in `hrtimer_interrupt` − the programmed expiry. Metrics `hrtimer.*`.
    pub hrtimer_latency: Option<TestModuleSpec>,
    /// The IPI latency test (did-implementation.md §6: `run_did
    /// send_ipi`): the guest's CPU 0 sends a CALL_FUNCTION_SINGLE IPI to
    /// its CPU 1 through the kernel's `apic->send_IPI` (the DID module's
    /// posted IPI when loaded); latency = the receiver's handler entry −
    /// the send. Needs 2 vCPUs or more. Metrics `ipi.*`.
    pub ipi_latency: Option<TestModuleSpec>,
    /// kvm-unit-tests' x86 `vmexit` micro-benchmarks (x86/vmexit.c), run
    /// as the guest's kernel on CPU 0: cycles per iteration of each test,
    /// metrics `vmexit.<test>_cycles` (docs/x86-today.md). Needs
    /// `guest.tick = "off"` (the tests own the LAPIC timer).
    pub vmexit: Option<VmexitSpec>,
    /// NetPIPE TCP ping-pong with the peer host.
    pub netpipe: Option<NetpipeSpec>,
    /// iperf TCP stream with the peer host.
    pub iperf: Option<IperfSpec>,
    /// Fio on a virtio-blk disk over a host RAM disk.
    pub fio: Option<FioSpec>,
    /// Memcached server in the VM, load generator at the peer.
    pub memcached: Option<MemcachedSpec>,
    /// SIP B2BUA in the VM between a SIPp-like client and server.
    pub sip: Option<SipSpec>,
    /// netperf TCP_STREAM or UDP_STREAM between the VM and the client host
    /// (ES2 §6).
    pub netperf: Option<NetperfSpec>,
    /// nginx in the VM, ApacheBench processes on the client host (ES2 §6.3).
    pub nginx: Option<NginxSpec>,
    /// Apache (one thread per connection) in the VM, ApacheBench on the
    /// client host: the served-time distribution (ES2 §6.4).
    pub apache: Option<ApacheSpec>,
    /// ping from the client host; the guest kernel answers in its softirq
    /// (ES2 §6.4).
    pub ping: Option<PingSpec>,
    /// The VM's netperf sockets are vCanal's (`AF_VSOCKET`, vcanal.md §2):
    /// libCanal forwards each socket call over the VM's shared-memory
    /// channel to the host's vCanal service, which runs it on the host's
    /// stack. Its program is netperf's (tcp-stream with the VM sending, or
    /// udp-rr, one instance) or nginx's (`workers` epoll-loop threads over
    /// libCanal, ApacheBench on the client host); without either nothing
    /// uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcanal: Option<VcanalSpec>,
}

impl WorkloadSpec {
    /// Whether no workload is configured (an idle VM).
    pub fn is_empty(&self) -> bool {
        self.udp.is_none()
            && self.whileloop.is_none()
            && self.cyclictest.is_none()
            && self.hrtimer_latency.is_none()
            && self.ipi_latency.is_none()
            && self.vmexit.is_none()
            && self.fio.is_none()
            && !self.peers()
    }

    /// Whether a TCP workload (talking to the peer host) is configured.
    pub fn tcp(&self) -> bool {
        self.netpipe.is_some() || self.iperf.is_some() || self.memcached.is_some()
    }

    /// Whether a workload talks to peer hosts (TCP workloads, SIP, the
    /// ES2 workloads).
    pub fn peers(&self) -> bool {
        self.tcp() || self.sip.is_some() || self.es2()
    }

    /// Whether one of ES2's workloads (netperf, nginx, apache, ping) is
    /// configured.
    pub fn es2(&self) -> bool {
        self.netperf.is_some()
            || self.nginx.is_some()
            || self.apache.is_some()
            || self.ping.is_some()
    }

    /// The network workloads configured, by table name (at most one may
    /// run in a VM).
    pub fn network_workloads(&self) -> Vec<&'static str> {
        [
            ("netpipe", self.netpipe.is_some()),
            ("iperf", self.iperf.is_some()),
            ("memcached", self.memcached.is_some()),
            ("sip", self.sip.is_some()),
            ("netperf", self.netperf.is_some()),
            ("nginx", self.nginx.is_some()),
            ("apache", self.apache.is_some()),
            ("ping", self.ping.is_some()),
        ]
        .into_iter()
        .filter(|x| x.1)
        .map(|x| x.0)
        .collect()
    }

    /// Checks each workload table's keys and which workloads one VM can
    /// run together. `at`: this table as the user wrote it (`workload`
    /// for the single-VM form, `vm[i].workload`); `scheme`: the
    /// scenario's.
    pub fn validate(&self, at: &str, scheme: &str) -> Result<(), ScenarioError> {
        let table = |name: &str| key(at, name);
        if let Some(u) = &self.udp {
            u.validate(&table("udp"))?;
        }
        if let Some(f) = &self.fio {
            f.validate(&table("fio"), scheme)?;
        }
        if let Some(m) = &self.memcached {
            m.validate(&table("memcached"))?;
            if self.netpipe.is_some() || self.iperf.is_some() {
                return bad(at, "memcached", "one TCP workload per VM");
            }
        }
        if let Some(i) = &self.iperf {
            i.validate(&table("iperf"))?;
            if self.netpipe.is_some() {
                return bad(
                    at,
                    "iperf",
                    "one TCP workload per VM: drop workload.netpipe",
                );
            }
        }
        if let Some(n) = &self.netpipe {
            n.validate(&table("netpipe"))?;
        }
        let net = self.network_workloads();
        if net.len() > 1 && self.es2() {
            return bad(
                at,
                net[1],
                format!(
                    "one network workload per VM: {} cannot be combined",
                    net.join(" and ")
                ),
            );
        }
        if self.es2() && self.udp.is_some() {
            return bad(
                at,
                "udp",
                format!("cannot be combined with workload.{} yet", net[0]),
            );
        }
        if let Some(n) = &self.netperf {
            n.validate(&table("netperf"))?;
        }
        if let Some(v) = &self.vcanal {
            v.validate(&table("vcanal"))?;
            // Without netperf or nginx no program uses vCanal (the helper
            // driver still loads); with netperf, one of the tests vCanal
            // runs; nginx runs as vCanal's HTTP server (its `workers`
            // threads, each an epoll loop over libCanal).
            if self.apache.is_some() || self.ping.is_some() {
                return bad(
                    at,
                    "vcanal",
                    "runs netperf (tcp-stream send, udp-rr) or nginx, not apache or ping",
                );
            }
            let ok = self.netperf.as_ref().is_none_or(|n| {
                n.threads == 1
                    && match n.test {
                        NetperfTest::TcpStream => n.direction == NetperfDirection::Send,
                        NetperfTest::UdpRr => true,
                        NetperfTest::UdpStream => false,
                    }
            });
            if !ok {
                return bad(
                    at,
                    "vcanal",
                    "needs one netperf instance: tcp-stream with direction = \"send\", or udp-rr",
                );
            }
        }
        if let Some(n) = &self.nginx {
            n.validate(&table("nginx"))?;
        }
        if let Some(a) = &self.apache {
            a.validate(&table("apache"))?;
        }
        if let Some(p) = &self.ping {
            p.validate(&table("ping"))?;
        }
        if let Some(s) = &self.sip {
            s.validate(&table("sip"))?;
            if self.tcp() {
                return bad(
                    at,
                    "sip",
                    "cannot be combined with a TCP workload (netpipe, iperf, memcached)",
                );
            }
        }
        if self.peers() && self.udp.is_some() {
            return bad(
                at,
                "udp",
                "cannot be combined with a TCP or SIP workload yet",
            );
        }
        if let Some(w) = &self.whileloop {
            w.validate(&table("whileloop"))?;
        }
        if let Some(c) = &self.cyclictest {
            c.validate(&table("cyclictest"))?;
        }
        if let Some(h) = &self.hrtimer_latency {
            h.validate(&table("hrtimer_latency"))?;
        }
        if let Some(i) = &self.ipi_latency {
            i.validate(&table("ipi_latency"))?;
        }
        if let Some(v) = &self.vmexit {
            require(
                (1..=1_000_000).contains(&v.iterations),
                &table("vmexit"),
                "iterations",
                v.iterations,
                "in [1, 1000000]",
            )?;
            if v.tests.is_empty() {
                return bad(&table("vmexit"), "tests", "names no test");
            }
        }
        Ok(())
    }
}

/// Which netperf test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetperfTest {
    /// TCP_STREAM: a TCP bulk transfer, `msg_bytes` per send().
    TcpStream,
    /// UDP_STREAM: `msg_bytes` datagrams, one per sendto(); throughput is
    /// what the receiving application got.
    UdpStream,
    /// UDP_RR: one `msg_bytes` request, one equal response, then the next
    /// request (vcanal.md §4); the client records each round trip.
    /// `direction = "send"`: the VM is the client; `"recv"`: the client
    /// host is.
    UdpRr,
}

/// Which way a netperf stream flows, seen from the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetperfDirection {
    /// The VM sends to the client host (netperf in the VM).
    Send,
    /// The client host sends to the VM (netserver in the VM).
    Recv,
}

/// netperf (ES2 §6.2, §6.3: 512-byte TCP and UDP streams, 4 instances
/// per VM in the multi-VM runs).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetperfSpec {
    /// `tcp-stream` or `udp-stream`.
    #[serde(default = "netperf_test")]
    pub test: NetperfTest,
    /// `send` (the VM sends) or `recv` (the client host sends).
    #[serde(default = "netperf_direction")]
    pub direction: NetperfDirection,
    /// Bytes per send() / sendto() (netperf's `-m`; ES2: 512). UDP: at
    /// most 1472, one frame (IP fragmentation is not modelled).
    #[serde(default = "netperf_msg")]
    pub msg_bytes: u32,
    /// netperf instances, each its own process and connection (or UDP
    /// flow) on both hosts (ES2's multi-VM runs: 4 per VM).
    #[serde(default = "one_u16")]
    pub threads: u16,
}

fn netperf_test() -> NetperfTest {
    NetperfTest::TcpStream
}
fn netperf_direction() -> NetperfDirection {
    NetperfDirection::Send
}
fn netperf_msg() -> u32 {
    512
}
fn one_u16() -> u16 {
    1
}

impl NetperfSpec {
    /// Checks its keys (`at`: its table, `workload.netperf` or
    /// `vm[i].workload.netperf`).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let max = match self.test {
            NetperfTest::TcpStream => 1 << 20,
            // One datagram per frame: 1500-byte MTU less IP and UDP headers.
            NetperfTest::UdpStream | NetperfTest::UdpRr => 1472,
        };
        let msg = self.msg_bytes;
        let range = format!("1..={max} for this test");
        require((1..=max).contains(&msg), at, "msg_bytes", msg, &range)?;
        within(at, "threads", self.threads, 1, MAX_INSTANCES)
    }
}

/// nginx serving a static page to ApacheBench (ES2 §6.3). Without
/// `keep_alive` (ab's default) every request opens its own connection.
/// The request and header sizes are the keep-alive ones either way (a
/// request without `-k` is 24 bytes shorter, nginx's header 5).

#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NginxSpec {
    /// nginx worker processes, each an epoll loop over its own port's
    /// connections (ES2: 4, one per vCPU). On an SMP guest worker j runs
    /// on vCPU j mod vCPUs; on a 1-vCPU guest all share CPU 0.
    #[serde(default = "four_u16")]
    pub workers: u16,
    /// ApacheBench processes on the client host, each on its own CPU;
    /// process p talks to worker p mod workers (ES2: 4 per tested VM).
    #[serde(default = "four_u16")]
    pub ab_processes: u16,
    /// Requests each ab process keeps in flight, one per connection
    /// (ab's `-c`; default 1).
    #[serde(default = "one_u16")]
    pub concurrency: u16,
    /// ab's `-k`: each connection carries request after request. Default
    /// `false`, ab's default (ab(1): `-k` enables the HTTP KeepAlive
    /// feature), so every request has its own connection: handshake,
    /// nginx's accept, the request, nginx's close and ab's.
    #[serde(default)]
    pub keep_alive: bool,
    /// Body bytes of the page: nginx's default `index.html` ("Welcome to
    /// nginx!") is 612 bytes (the file in nginx's source distribution,
    /// `html/index.html`; ab reports it as "Document Length: 612 bytes").
    #[serde(default = "nginx_page")]
    pub page_bytes: u32,
    /// Response header bytes in front of the body. Default 238, counted
    /// from the header nginx 1.x sends for a static file over keep-alive
    /// (status line 17, Server 22, Date 37, Content-Type 25,
    /// Content-Length 21, Last-Modified 46, Connection 24, ETag 22,
    /// Accept-Ranges 22, blank line 2) [estimate].
    #[serde(default = "nginx_header")]
    pub header_bytes: u32,
    /// Request bytes ab sends. Default 100: `GET / HTTP/1.0` (16),
    /// `Connection: Keep-Alive` (24), `Host: 10.0.0.2` (16),
    /// `User-Agent: ApacheBench/2.3` (29), `Accept: */*` (13), blank
    /// line (2), each with its CRLF (ab 2.3's request with `-k`).
    #[serde(default = "http_request")]
    pub request_bytes: u32,
}

fn four_u16() -> u16 {
    4
}
fn nginx_page() -> u32 {
    612
}
fn nginx_header() -> u32 {
    238
}
fn http_request() -> u32 {
    100
}

impl NginxSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        within(at, "workers", self.workers, 1, MAX_INSTANCES)?;
        validate_http(
            at,
            (self.ab_processes, self.concurrency),
            (self.page_bytes, self.header_bytes, self.request_bytes),
        )
    }
}

/// Apache httpd (worker/prefork MPM: one thread per connection) serving a
/// small static page to ApacheBench; ES2 §6.4's served-time experiment:
/// one ab process, concurrency 16. Keep-alive as for `nginx` (default
/// off, ab's default).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApacheSpec {
    /// ApacheBench processes on the client host (ES2 §6.4: 1).
    #[serde(default = "one_u16")]
    pub ab_processes: u16,
    /// Requests each ab process keeps in flight, one per connection; the
    /// server runs one thread per connection (ES2 §6.4: 16).
    #[serde(default = "sixteen_u16")]
    pub concurrency: u16,
    /// ab's `-k`, as for `nginx` (default `false`, ab's default).
    #[serde(default)]
    pub keep_alive: bool,
    /// Body bytes: Apache 2.4's stock `htdocs/index.html`
    /// (`<html><body><h1>It works!</h1></body></html>` and a newline) is
    /// 45 bytes; ES2 says only "a small static page".
    #[serde(default = "apache_page")]
    pub page_bytes: u32,
    /// Response header bytes. Default 284, counted from Apache 2.4's
    /// header for a static file over keep-alive (status 17, Date 37,
    /// Server 32, Last-Modified 46, ETag 27, Accept-Ranges 22,
    /// Content-Length 20, Keep-Alive 32, Connection 24, Content-Type 25,
    /// blank line 2) [estimate].
    #[serde(default = "apache_header")]
    pub header_bytes: u32,
    /// Request bytes ab sends (as for `nginx`: 100).
    #[serde(default = "http_request")]
    pub request_bytes: u32,
}

fn sixteen_u16() -> u16 {
    16
}
fn apache_page() -> u32 {
    45
}
fn apache_header() -> u32 {
    284
}

impl ApacheSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        validate_http(
            at,
            (self.ab_processes, self.concurrency),
            (self.page_bytes, self.header_bytes, self.request_bytes),
        )
    }
}

/// The keys nginx and apache share (`at`: the table): ApacheBench's
/// processes and concurrency, the page, header and request sizes.
fn validate_http(
    at: &str,
    (ab, c): (u16, u16),
    (page, header, req): (u32, u32, u32),
) -> Result<(), ScenarioError> {
    within(at, "ab_processes", ab, 1, MAX_INSTANCES)?;
    let connections = u32::from(ab) * u32::from(c);
    if c == 0 || connections > MAX_HTTP_CONNECTIONS {
        return bad(
            at,
            "concurrency",
            format!(
                "{c} must be at least 1, and ab_processes × concurrency = {connections} at most {MAX_HTTP_CONNECTIONS}"
            ),
        );
    }
    within(at, "page_bytes", page, 1, 1 << 20)?;
    let status_line = "17..=65536 (a status line at least)";
    require(
        (17..=65536).contains(&header),
        at,
        "header_bytes",
        header,
        status_line,
    )?;
    let request_line = "16..=65536 (a request line at least)";
    require(
        (16..=65536).contains(&req),
        at,
        "request_bytes",
        req,
        request_line,
    )
}

/// ping (ES2 §6.4: one echo request every second, RTT distribution).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PingSpec {
    /// Seconds between echo requests (ping's `-i`; default 1, as ES2).
    #[serde(default = "ping_interval")]
    pub interval_s: f64,
    /// ICMP payload bytes (ping's `-s`; default 56).
    #[serde(default = "ping_payload")]
    pub payload_bytes: u32,
}

fn ping_interval() -> f64 {
    1.0
}
fn ping_payload() -> u32 {
    56
}

impl PingSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let i = self.interval_s;
        require(
            (1e-5..=10.0).contains(&i),
            at,
            "interval_s",
            i,
            "in [1e-5, 10]",
        )?;
        let p = self.payload_bytes;
        require(p <= 1472, at, "payload_bytes", p, "0..=1472 (one frame)")
    }
}

/// SIP (DID §5.8): SIPp's `-r rate_cps -d call_duration_s -m calls`.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SipSpec {
    /// New calls per second (the paper: 100).
    #[serde(default = "sip_rate")]
    pub rate_cps: f64,
    /// Seconds an answered call lasts (the paper: 10).
    #[serde(default = "sip_duration")]
    pub call_duration_s: f64,
    /// Calls to place (the paper: 10,000).
    #[serde(default = "sip_calls")]
    pub calls: u32,
    /// Where the B2BUA's RADIUS server runs: Sippy authenticates each
    /// credentialed INVITE through a radiusclient process and a RADIUS
    /// server (docs/calibration-sources.md §14).
    #[serde(default)]
    pub radius: SipRadius,
}

/// Where the SIP B2BUA's RADIUS server is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SipRadius {
    /// On the load generator, beside the UAC: each Access-Request crosses
    /// the VM's NIC and the link both ways.
    #[default]
    LoadGenerator,
    /// No RADIUS: the B2BUA checks the digest itself.
    Off,
}

fn sip_rate() -> f64 {
    100.0
}
fn sip_duration() -> f64 {
    10.0
}
fn sip_calls() -> u32 {
    10_000
}

impl SipSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let r = self.rate_cps;
        require(r > 0.0 && r <= 1e5, at, "rate_cps", r, "in (0, 100000]")?;
        let d = self.call_duration_s;
        require(
            (0.0..=3600.0).contains(&d),
            at,
            "call_duration_s",
            d,
            "in [0, 3600]",
        )?;
        within(at, "calls", self.calls, 1, 1_000_000)
    }
}

/// The memcached load generator's shape.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum MemcachedClientKind {
    /// Open loop (mutilate-style, DID §5.7): Poisson arrivals at
    /// `rate_rps` round robin over the connections.
    #[default]
    OpenLoop,
    /// Closed loop (memaslap, ES2 §6.3): `concurrency` requests in flight,
    /// each re-issued as soon as its reply arrives.
    Memaslap,
}

/// Memcached.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemcachedSpec {
    /// Offered load, requests/s (the open-loop client; required for it,
    /// not allowed with `memaslap`).
    #[serde(default)]
    pub rate_rps: Option<f64>,
    /// `open-loop` (default) or `memaslap` (closed loop).
    #[serde(default)]
    pub client: MemcachedClientKind,
    /// memaslap's concurrency: requests in flight, spread round robin
    /// over the connections (ES2: 256, with 256 connections).
    #[serde(default = "mc_concurrency")]
    pub concurrency: u32,
    /// Share of gets, percent. Default: 80 for the open-loop client
    /// (4 gets per set, DID's mix), 90 for memaslap (its default 9:1,
    /// ES2's mix).
    #[serde(default)]
    pub get_pct: Option<f64>,
    /// TCP connections (the paper: 200).
    #[serde(default = "mc_conns")]
    pub connections: u16,
    /// Server worker threads (the paper: 2).
    #[serde(default = "mc_threads")]
    pub threads: u16,
    /// Load-generator threads, each on its own CPU (the paper: 8).
    #[serde(default = "mc_client_threads")]
    pub client_threads: u16,
    /// Key bytes.
    #[serde(default = "mc_key")]
    pub key_bytes: u32,
    /// Value bytes.
    #[serde(default = "mc_value")]
    pub value_bytes: u32,
}

fn mc_conns() -> u16 {
    200
}
fn mc_concurrency() -> u32 {
    256
}
fn mc_threads() -> u16 {
    2
}
fn mc_client_threads() -> u16 {
    8
}
fn mc_key() -> u32 {
    30
}
fn mc_value() -> u32 {
    400
}

impl MemcachedSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        match (self.client, self.rate_rps) {
            (MemcachedClientKind::OpenLoop, None) => {
                return bad(
                    at,
                    "rate_rps",
                    "missing: the open-loop client's offered rate, requests/s (or set client = \"memaslap\")",
                );
            }
            (MemcachedClientKind::OpenLoop, Some(r)) => {
                require(r > 0.0 && r <= 1e7, at, "rate_rps", r, "in (0, 1e7]")?;
            }
            _ => {}
        }
        within(at, "connections", self.connections, 1, 4000)?;
        if self.threads == 0 || self.threads > self.connections {
            return bad(
                at,
                "threads",
                "must be at least 1 and at most the connections",
            );
        }
        within(
            at,
            "client_threads",
            self.client_threads,
            1,
            MAX_CLIENT_THREADS,
        )?;
        within(at, "key_bytes", self.key_bytes, 1, 250)?;
        within(at, "value_bytes", self.value_bytes, 1, 1 << 20)?;
        if let Some(g) = self.get_pct {
            require((0.0..=100.0).contains(&g), at, "get_pct", g, "in [0, 100]")?;
        }
        if self.client == MemcachedClientKind::Memaslap {
            if self.rate_rps.is_some() {
                return bad(
                    at,
                    "rate_rps",
                    "memaslap is a closed-loop client: its rate is what the server answers; remove rate_rps",
                );
            }
            let depth = crate::workloads::memcached::PIPELINE_DEPTH;
            let most = u32::from(self.connections) * depth as u32;
            if self.concurrency == 0 || self.concurrency > most {
                return bad(
                    at,
                    "concurrency",
                    format!(
                        "{} must be at least 1 and at most connections × {depth} = {most}",
                        self.concurrency
                    ),
                );
            }
        }
        Ok(())
    }
}

/// Fio.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FioSpec {
    /// Request size, bytes (the paper: 4 KB).
    #[serde(default = "fio_block")]
    pub block_bytes: u32,
    /// Share of reads, percent (the paper: random reads and writes).
    #[serde(default = "fio_reads")]
    pub read_pct: f64,
    /// RAM-disk size, bytes (the paper: 1 GB).
    #[serde(default = "fio_disk")]
    pub disk_bytes: u64,
    /// The guard timer Fio arms per request, ms (0: none).
    #[serde(default = "fio_guard")]
    pub guard_ms: f64,
}

fn fio_block() -> u32 {
    4096
}
fn fio_reads() -> f64 {
    50.0
}
fn fio_disk() -> u64 {
    1 << 30
}
fn fio_guard() -> f64 {
    10.0
}

impl FioSpec {
    /// Checks its keys (`at`: its table); `scheme`: the scenario's, since
    /// bare metal has no virtio-blk back end.
    pub fn validate(&self, at: &str, scheme: &str) -> Result<(), ScenarioError> {
        let block = self.block_bytes;
        require(
            (512..=(1 << 20)).contains(&block) && block.is_multiple_of(512),
            at,
            "block_bytes",
            block,
            "a multiple of 512 in 512..=1048576",
        )?;
        within(at, "read_pct", self.read_pct, 0.0, 100.0)?;
        let disk = self.disk_bytes;
        if disk < block as u64 || disk > MAX_DISK_BYTES {
            return bad(
                at,
                "disk_bytes",
                format!(
                    "{disk} must hold at least one block and be at most {MAX_DISK_BYTES} (1 TiB)"
                ),
            );
        }
        within(at, "guard_ms", self.guard_ms, 0.0, 10_000.0)?;
        if scheme == "bare-metal" {
            return bad(
                at,
                "",
                "virtio-blk needs a hypervisor: bare metal has no QEMU back end",
            );
        }
        Ok(())
    }
}

/// Which way an iperf stream flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IperfDirection {
    /// The peer host sends, the VM receives.
    ToVm,
    /// The VM sends, the peer host receives.
    FromVm,
}

/// iperf.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IperfSpec {
    /// Direction of the stream.
    #[serde(default = "to_vm")]
    pub direction: IperfDirection,
    /// Bytes per read()/write() call (iperf's default buffer: 128 KiB).
    #[serde(default = "iperf_len")]
    pub len_bytes: u32,
}

fn to_vm() -> IperfDirection {
    IperfDirection::ToVm
}
fn iperf_len() -> u32 {
    128 * 1024
}

impl IperfSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        within(at, "len_bytes", self.len_bytes, 1, 1 << 24)
    }
}

/// NetPIPE.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetpipeSpec {
    /// Message size, bytes (the paper: 32 to 1024).
    pub msg_bytes: u32,
}

impl NetpipeSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        within(at, "msg_bytes", self.msg_bytes, 1, 65536)
    }
}

/// UDP PacketGen.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UdpSpec {
    /// Packets per second.
    pub rate_pps: f64,
    /// UDP payload bytes.
    #[serde(default = "payload")]
    pub payload_bytes: u32,
    /// Datagrams the sending host's PacketGen sends per wake-up, back to
    /// back at its sendto cost (`peer.udp_tx_datagram_ns`), a burst every
    /// `burst / rate_pps` seconds; 1 (the default) is a perfectly periodic
    /// sender. The DID paper does not state it: its scenarios name their
    /// value as an assumption (1..=4096).
    #[serde(default = "one_burst")]
    pub burst: u32,
}

fn payload() -> u32 {
    128
}

fn one_burst() -> u32 {
    1
}

impl UdpSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let r = self.rate_pps;
        let line_rate = "in (0, 14880952] (10 GbE line rate of minimum frames)";
        require(r > 0.0 && r <= 14_880_952.0, at, "rate_pps", r, line_rate)?;
        within(at, "payload_bytes", self.payload_bytes, 18, 1472)?;
        within(at, "burst", self.burst, 1, 4096)
    }
}

/// WhileLoop.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhileLoopSpec {
    /// Loop iterations (the paper: 2^34).
    pub iterations: f64,
}

impl WhileLoopSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let n = self.iterations;
        require(
            (1.0..1e15).contains(&n),
            at,
            "iterations",
            n,
            "in [1, 1e15)",
        )
    }
}

/// cyclictest.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CyclictestSpec {
    /// Timer interval, µs.
    #[serde(default = "interval")]
    pub interval_us: f64,
    /// How the thread waits for its next period: `nanosleep` (`-n`,
    /// `clock_nanosleep(TIMER_ABSTIME)`) or `posix-timer` (rt-tests up to
    /// 0.8x without `-n`: a periodic POSIX timer whose signal the thread
    /// takes with `sigwait`).
    #[serde(default)]
    pub mode: CyclictestMode,
    /// rt-tests' main thread beside the measuring one: it loops on
    /// `usleep(10000)` for as long as the test runs (`main` of
    /// `src/cyclictest/cyclictest.c`), a normal-priority task whose
    /// pending hrtimer the kernel reprograms the clockevent to after each
    /// of the measuring thread's expiries. This models it as run with
    /// `-q` (it prints nothing until the end). Off: the measuring thread
    /// alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub main_thread: bool,
}

/// cyclictest's wait for the next period (rt-tests `src/cyclictest`,
/// `timerthread`; docs/papers.md, "DID cyclictest under KVM 3.6").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum CyclictestMode {
    /// `-n`: `clock_nanosleep(TIMER_ABSTIME)` to the next deadline; the
    /// hrtimer's expiry wakes the thread (`hrtimer_wakeup`) in the
    /// interrupt.
    #[default]
    Nanosleep,
    /// rt-tests' default before clock_nanosleep became it (v0.83 and
    /// earlier: `MODE_CYCLIC`): `timer_create(SIGEV_THREAD_ID)` with an
    /// interval, waited for with `sigwait`. The expiry queues a signal
    /// (`posix_timer_fn` → `send_sigqueue`), and the woken thread's
    /// `dequeue_signal` re-arms the timer (`do_schedule_next_timer`)
    /// before cyclictest reads the clock.
    PosixTimer,
}

fn interval() -> f64 {
    1000.0
}

impl CyclictestSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        validate_interval_us(at, self.interval_us)
    }
}

/// A periodic timer's `interval_us` (cyclictest, the test modules):
/// 10 µs to 1 s.
fn validate_interval_us(at: &str, i: f64) -> Result<(), ScenarioError> {
    require(
        (10.0..=1e6).contains(&i),
        at,
        "interval_us",
        i,
        "in [10, 1e6]",
    )
}

/// `workload.vmexit`: which of kvm-unit-tests' vmexit tests run, and how
/// many iterations each.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VmexitSpec {
    /// The tests, by their kvm-unit-tests names, in the order they run
    /// (default: every modelled test).
    #[serde(default = "vmexit_tests")]
    pub tests: Vec<crate::workloads::vmexit::Test>,
    /// Iterations of each test (the real test doubles its count until 2^30
    /// TSC cycles pass; the model's cycles per iteration settle far
    /// sooner). Default 200.
    #[serde(default = "vmexit_iterations")]
    pub iterations: u32,
}

fn vmexit_tests() -> Vec<crate::workloads::vmexit::Test> {
    crate::workloads::vmexit::Test::ALL.to_vec()
}

fn vmexit_iterations() -> u32 {
    200
}

/// The period of a kernel test module's hrtimer (`workload.hrtimer_latency`,
/// `workload.ipi_latency`).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestModuleSpec {
    /// The module's hrtimer period, µs: between expiries measured
    /// (hrtimer_latency) or between IPIs sent (ipi_latency).
    #[serde(default = "interval")]
    pub interval_us: f64,
}

impl TestModuleSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        validate_interval_us(at, self.interval_us)
    }
}

/// How a libCanal waiter learns that its call completed (vcanal.md §2.5,
/// §3 "Notification polling / interrupt / switching").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum VcanalNotification {
    /// Poll the INR up to `poll_budget` times, then ask for the completion
    /// interrupt and sleep (the paper's default).
    #[default]
    Switching,
    /// Poll until done; never an interrupt.
    Polling,
    /// Check once, then ask for the interrupt.
    Interrupt,
}

/// What libCanal does in one iteration of its wait loop besides looking at
/// the INR's state (vcanal.md §2.5: it polls "for a while", a count of
/// polls, 100 by default, "instead of waiting a specific period"; the
/// paper does not say what else an iteration does).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum VcanalSpin {
    /// The load of the state word, the compare and the loop's PAUSE, as
    /// glibc's adaptive mutex spins before its futex wait (at most 100
    /// iterations, the "futex-like" precedent of a counted spin):
    /// `vcanal.spin_poll_ns` per iteration.
    #[default]
    Pause,
    /// Each iteration also calls `sched_yield()` (a 2012 user-space
    /// spin-wait that lets other runnable threads have the CPU): the
    /// system call's entry and exit (`guest.syscall_ns`) and the
    /// scheduler's yield with nothing else to run on the vCPU
    /// (`vcanal.sched_yield_ns`), past the poll itself.
    Yield,
}

/// Which idle network-pool thread the vCanal polling thread hands a call
/// to (vcanal.md §2.4: "an idle thread in the network thread pool"; the
/// paper does not say how the pool waits).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum VcanalPoolWake {
    /// The pool's threads wait on one work queue's condition variable
    /// (pthread_cond_wait), and each hand-off is a pthread_cond_signal:
    /// glibc's FUTEX_WAKE of one waiter, which Linux's futex_wake takes in
    /// queue order (the hash bucket's plist keeps waiters of equal
    /// priority first in, first out). The thread idle longest gets the
    /// call, so calls go round the pool.
    #[default]
    Condvar,
    /// Each thread waits on a semaphore of its own, and the poller scans
    /// the pool for the first idle one: the same thread takes every call
    /// of a one-call-at-a-time program.
    FirstIdle,
}

/// vCanal for a VM's sockets (vcanal.md §2, §3).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VcanalSpec {
    /// Completion notification.
    #[serde(default)]
    pub notification: VcanalNotification,
    /// Polls before interrupt mode under `switching` (§2.5: 100).
    #[serde(default = "vcanal_poll_budget")]
    pub poll_budget: u32,
    /// What one wait-loop iteration does besides the poll: `pause` (the
    /// default: a cache hit and a PAUSE) or `yield` (a `sched_yield()`
    /// system call each iteration). See [`VcanalSpin`].
    #[serde(default)]
    pub spin: VcanalSpin,
    /// libCanal's hybrid address space (§2.6); off: every buffer page is
    /// walked by the helper driver on every call ("w/o Hybrid Address
    /// Space").
    #[serde(default = "vcanal_yes")]
    pub hybrid_address_space: bool,
    /// The host core the vCanal service's polling thread and network pool
    /// run on, and the host NIC's interrupts are steered to (§2.1, §3):
    /// no vCPU may run there (core 0, the host's, may be it). Default: the
    /// machine's last core. Every vCanal VM names the same.
    #[serde(default)]
    pub service_core: Option<usize>,
    /// Network-pool threads (§7: 8), each a host thread of its own under
    /// the host scheduler, on the service core with affinity.
    #[serde(default = "vcanal_pool")]
    pub pool_threads: u16,
    /// Which idle pool thread takes a call: `condvar` (the default: one
    /// work queue and condition variable, the longest-waiting thread
    /// wakes, FIFO as Linux's futex_wake takes waiters) or `first-idle`
    /// (a semaphore per thread, the first idle one in the pool's order).
    /// With `condvar` a woken thread has slept through the other threads'
    /// calls, and CFS places it up to half a latency period behind the
    /// poller, so it preempts it; with `first-idle` the one busy thread
    /// runs ahead of the poller in virtual time and shares the core with
    /// it by weight.
    #[serde(default)]
    pub pool_wake: VcanalPoolWake,
    /// The polling thread calls `sched_yield` after a round that found
    /// every channel empty, so that a pool thread waiting for the core
    /// gets it (CFS passes over the yielder for a waiting thread within
    /// the wake-up granularity of it). `false`: it spins on, and a woken
    /// pool thread that does not preempt it waits for its CFS slice to end.
    #[serde(default = "vcanal_yes")]
    pub poller_yield: bool,
    /// The polling thread's nice level (0..=19; a raised priority is not
    /// offered). Default 0, a new thread's: with the pool threads on its
    /// core (affinity), CFS gives the never-sleeping poller its weight's
    /// share of the core whenever a pool thread has work.
    #[serde(default)]
    pub poller_nice: u8,
    /// "vCanal w/o Polling" (vcanal.md §3; §7: both directions): libCanal
    /// notifies the host of each request through the helper driver's
    /// doorbell (an I/O-port write, an exit) and the service sleeps while
    /// its channels are empty instead of polling. Combine with
    /// `notification = "interrupt"` for the paper's variant.
    #[serde(default)]
    pub kick: bool,
    /// The service host NIC's receive interrupt moderation (its interrupt
    /// goes to the service core, §2.1): `adaptive` (ixgbe's adaptive
    /// interval from 20K/s, as the client host's NIC, `net.peer_itr`),
    /// `fixed` (`peer.rx_itr_us`), or `off` (an interrupt for each batch
    /// of frames the service core finds waiting).
    #[serde(default)]
    pub host_nic_itr: crate::scenario::PeerItr,
    /// Affinity (vcanal.md §2.1, §3): the service's threads pinned to the
    /// service core and the host NIC's interrupts steered there. `false`
    /// is "vCanal w/o Affinity" ("default thread scheduling and IRQ
    /// distribution"): the service's thread is a thread of the host
    /// scheduler that may run on any core, starting on `service_core`,
    /// as are its pool threads, and the NIC's interrupt goes to
    /// `nic_irq_core`.
    #[serde(default = "vcanal_yes")]
    pub affinity: bool,
    /// Without affinity: the core the host NIC's queue interrupt lands on.
    /// Default: the core of the VM's application vCPU (an unmanaged IRQ
    /// on Linux 3.5's flat APIC mode goes to one CPU of its all-CPUs
    /// mask; the paper's "external-interrupt exits remain" means a vCPU
    /// core). Refused with affinity (the service core takes it there).
    #[serde(default)]
    pub nic_irq_core: Option<usize>,
}

/// Most network-pool threads.
pub const MAX_VCANAL_POOL: u16 = 64;

fn vcanal_poll_budget() -> u32 {
    crate::guest::libcanal::DEFAULT_POLL_BUDGET
}
fn vcanal_yes() -> bool {
    true
}
fn vcanal_pool() -> u16 {
    8
}

impl VcanalSpec {
    /// Checks its keys (`at`: its table).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        within(at, "poll_budget", self.poll_budget, 1, 1_000_000)?;
        within(at, "pool_threads", self.pool_threads, 1, MAX_VCANAL_POOL)?;
        within(at, "poller_nice", self.poller_nice, 0, 19)?;
        if let Some(c) = self.service_core {
            within(at, "service_core", c, 0, 63)?;
        }
        if let Some(c) = self.nic_irq_core {
            within(at, "nic_irq_core", c, 0, 63)?;
            if self.affinity {
                // With affinity the NIC's interrupt goes to the service
                // core (§2.1): a core named here would be ignored.
                return bad(at, "nic_irq_core", "applies only with affinity = false");
            }
        }
        Ok(())
    }

    /// The poll budget libCanal runs with.
    pub fn effective_poll_budget(&self) -> u32 {
        match self.notification {
            VcanalNotification::Switching => self.poll_budget,
            VcanalNotification::Polling => u32::MAX,
            // libCanal polls once before it can arm (`wait` counts the
            // failed poll first).
            VcanalNotification::Interrupt => 1,
        }
    }
}
