//! A headless Chromium driven over WebDriver (chromedriver), for tests of
//! the dashboard; and plain HTTP requests to a server's listener.
//!
//! chromedriver is started on a free port in its own process group, with
//! Chromium as its child: dropping the [`Browser`] kills the group, so
//! neither outlives the test. The WebDriver client is a few requests over
//! HTTP/1.1 (`Connection: close`), not a crate: the tests need five calls.
//! Found as `chromium` and `chromedriver` on the path (Debian's packages,
//! `scripts/test.sh`) or where `SUBC_CHROMIUM` and `SUBC_CHROMEDRIVER`
//! say; absent, the test is skipped, except under `CI=true`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A WebDriver session on a headless Chromium.
pub struct Browser {
    driver: std::process::Child,
    at: SocketAddr,
    session: String,
}

/// The flags the issue asks for, and a window the screenshot is taken of.
const CHROMIUM_ARGS: [&str; 5] = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1300"];

/// `var`'s path, or `name` on the path.
fn program(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

impl Browser {
    /// Starts chromedriver and a session, or says why not: `None` (the
    /// test skips) only outside CI.
    pub async fn start(test: &str) -> Option<Browser> {
        let (chromium, driver) = (program("SUBC_CHROMIUM", "chromium"), program("SUBC_CHROMEDRIVER", "chromedriver"));
        let (Some(chromium), Some(driver)) = (chromium, driver) else {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "{test}: CI=true but chromium or chromedriver is missing (apt-get install chromium chromium-driver; scripts/test.sh)"
            );
            eprintln!("{test}: skipped: chromium and chromedriver are not on the path (apt-get install chromium chromium-driver)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(&driver)
                .arg(format!("--port={port}"))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("{} starts: {e}", driver.display()))
        };
        let mut b = Browser { driver: child, at: SocketAddr::from(([127, 0, 0, 1], port)), session: String::new() };
        b.wait_ready().await;
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": CHROMIUM_ARGS},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let created = b.call("POST", "/session", Some(caps)).await;
        b.session = created["sessionId"].as_str().unwrap_or_else(|| panic!("a WebDriver session: {created}")).to_string();
        Some(b)
    }

    async fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok((200, body)) = request(self.at, "GET", "/status", &[], None).await {
                if serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v["value"]["ready"] == true) {
                    return;
                }
            }
            assert!(Instant::now() < until, "chromedriver did not get ready within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A WebDriver command; its `value`. A WebDriver error fails the test.
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        let body = body.map(|b| b.to_string());
        let (status, reply) = request(self.at, method, path, &[("Content-Type", "application/json")], body.as_deref().map(str::as_bytes))
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        assert_eq!(status, 200, "WebDriver {method} {path}: {reply}");
        reply["value"].clone()
    }

    fn path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", &self.path("/url"), Some(serde_json::json!({"url": url}))).await;
    }

    /// Runs `script` (a function body: `return ...`) in the page.
    pub async fn eval(&self, script: &str) -> serde_json::Value {
        self.call("POST", &self.path("/execute/sync"), Some(serde_json::json!({"script": script, "args": []}))).await
    }

    /// Runs `script` every 50 ms until it returns something truthy (not
    /// null, false, 0 or ""), which is returned; fails after `within`.
    pub async fn wait_for(&self, what: &str, script: &str, within: Duration) -> serde_json::Value {
        let until = Instant::now() + within;
        loop {
            let v = self.eval(script).await;
            let truthy = !(v.is_null() || v == false || v == 0 || v == "");
            if truthy {
                return v;
            }
            assert!(Instant::now() < until, "{what}: not within {within:?} (the script returned {v})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's console messages of level SEVERE since the last call
    /// (script errors, refused resources, Content-Security-Policy violations).
    pub async fn console_errors(&self) -> Vec<String> {
        let log = self.call("POST", &self.path("/se/log"), Some(serde_json::json!({"type": "browser"}))).await;
        let entries = log.as_array().cloned().unwrap_or_default();
        entries.iter().filter(|e| e["level"] == "SEVERE").map(|e| e["message"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", &self.path("/screenshot"), None).await;
        base64_decode(b64.as_str().expect("a screenshot in base64"))
    }

    /// Ends the session (the browser quits) and chromedriver.
    pub async fn close(mut self) {
        let path = self.path("");
        let _ = tokio::time::timeout(Duration::from_secs(5), request(self.at, "DELETE", &path, &[], None)).await;
        self.session.clear();
    }
}

impl Drop for Browser {
    /// Kills chromedriver's process group: chromedriver, and Chromium if
    /// the session did not end.
    fn drop(&mut self) {
        // SAFETY: kill(2) with a process group id we started; no memory is involved.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// One HTTP/1.1 request (`Connection: close`) to `at`: the status and the
/// body (de-chunked).
pub async fn request(
    at: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let (status, _, body) = request_with_headers(at, method, path, headers, body).await?;
    Ok((status, body))
}

/// [`request`], with the response's headers (names lower-cased).
pub async fn request_with_headers(
    at: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut s = tokio::net::TcpStream::connect(at).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    let body = body.unwrap_or_default();
    head += &format!("Content-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    let (raw, split) = read_head(&mut s).await?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP response: {}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).ok_or_else(bad)?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut body = raw[split + 4..].to_vec();
    // Servers may keep the connection open (chromedriver does): read what
    // the headers say, not to the end.
    if let Some(length) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        while body.len() < length {
            let mut buf = vec![0; length - body.len()];
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&buf[..n]);
        }
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        while !body.ends_with(b"0\r\n\r\n") {
            let mut buf = [0; 4096];
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&buf[..n]);
        }
        body = dechunk(&body);
    } else {
        s.read_to_end(&mut body).await?;
    }
    Ok((status, headers, body))
}

/// Reads up to the end of a response's headers: what was read, and where
/// the blank line starts.
async fn read_head(s: &mut tokio::net::TcpStream) -> std::io::Result<(Vec<u8>, usize)> {
    let mut raw = vec![];
    loop {
        if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((raw, split));
        }
        let mut buf = [0; 4096];
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection closed before the headers ended"));
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let sextets: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(sextets.len() * 3 / 4);
    for chunk in sextets.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &s)| acc | (s as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
