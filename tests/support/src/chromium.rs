//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol: open
//! a page, wait for it to load, read its DOM with JavaScript, collect what it logs
//! as errors, and take a screenshot. One page per browser; the browser and its
//! profile go when the [`Browser`] is dropped.

use base64::Engine;
use serde_json::{json, Value};
use std::io::BufRead;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// How long one command or page load may take.
const WAIT: Duration = Duration::from_secs(30);

/// A running headless Chromium with one page open.
pub struct Browser {
    child: Child,
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// Events seen while waiting for answers, not yet taken.
    events: Vec<Value>,
    /// What the page logged as errors (console, exceptions, failed loads).
    errors: Vec<String>,
    profile: PathBuf,
}

/// The Chromium binary, or `None` (the caller skips, or fails under `CI=true`).
pub fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

impl Browser {
    /// Starts Chromium headless with a fresh profile under `dir` and a 1280×800
    /// page; `None` when no Chromium is installed (and `CI` is not `true`).
    pub fn start(dir: &Path) -> Option<Browser> {
        let Some(bin) = chromium() else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "chromium is not installed; .ci/run installs Debian's chromium"
            );
            eprintln!("no chromium on this machine; install Debian's chromium to run this test");
            return None;
        };
        let profile = dir.join("chromium-profile");
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("profile dir");
        let mut child = Command::new(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1280,800",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        // It says where its DevTools listen on stderr: "DevTools listening on ws://…".
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(WAIT)
            .expect("chromium says where its DevTools listen");
        let hostport = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("a ws:// URL");
        let stream = TcpStream::connect(hostport).expect("connect to DevTools");
        // The handshake gets the whole wait: a busy CI machine answers it in more
        // than the short poll interval, and a timed-out read mid-handshake is fatal.
        stream.set_read_timeout(Some(WAIT)).expect("timeout");
        let (ws, _) = tungstenite::client(url.as_str(), stream).expect("DevTools handshake");
        ws.get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let mut b = Browser {
            child,
            ws,
            session: String::new(),
            next_id: 1,
            events: Vec::new(),
            errors: Vec::new(),
            profile,
        };
        let target = b.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = b.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(domain, json!({}));
        }
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": false }),
        );
        Some(b)
    }

    /// Sends one command (to the page once attached) and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < WAIT, "{method}: no answer in {WAIT:?}");
            let Some(v) = self.read() else { continue };
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
            self.event(v);
        }
    }

    /// One message, or `None` after a short wait.
    fn read(&mut self) -> Option<Value> {
        match self.ws.read() {
            Ok(Message::Text(t)) => serde_json::from_str(t.as_str()).ok(),
            Ok(_) => None,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("DevTools: {e}"),
        }
    }

    /// Keeps an event, noting it when it is an error of the page.
    fn event(&mut self, v: Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(format!(
                "exception: {}",
                p["exceptionDetails"]["exception"]["description"]
                    .as_str()
                    .or(p["exceptionDetails"]["text"].as_str())
                    .unwrap_or("?")
            )),
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.errors.push(format!("console.error: {}", p["args"]))
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => self.errors.push(format!(
                "{}: {} {}",
                p["entry"]["source"].as_str().unwrap_or("log"),
                p["entry"]["text"].as_str().unwrap_or(""),
                p["entry"]["url"].as_str().unwrap_or("")
            )),
            _ => {}
        }
        self.events.push(v);
    }

    /// Waits for the page's next load event (after a navigation or a form's submit).
    fn wait_load(&mut self) {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self
                .events
                .iter()
                .position(|e| e["method"] == "Page.loadEventFired")
            {
                self.events.drain(..=i);
                return;
            }
            assert!(t0.elapsed() < WAIT, "the page did not load in {WAIT:?}");
            if let Some(v) = self.read() {
                self.event(v);
            }
        }
    }

    /// Opens `url` and waits until it has loaded.
    pub fn goto(&mut self, url: &str) {
        self.events.clear();
        let r = self.call("Page.navigate", json!({ "url": url }));
        assert!(r.get("errorText").is_none(), "{url}: {}", r["errorText"]);
        self.wait_load();
    }

    /// Runs `js` in the page and waits for the navigation it starts (a form's
    /// submit, a click on a link) to load.
    pub fn navigate_by(&mut self, js: &str) {
        self.events.clear();
        self.eval(js);
        self.wait_load();
    }

    /// The value of the expression `js` in the page (awaited when a promise).
    pub fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{js}: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// The text of the first element `selector` finds, trimmed; `None` if none.
    pub fn text(&mut self, selector: &str) -> Option<String> {
        let v = self.eval(&format!(
            "(() => {{ const e = document.querySelector({}); return e ? e.textContent.trim() : null; }})()",
            json!(selector)
        ));
        v.as_str().map(str::to_string)
    }

    /// A PNG of what the page shows, written to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("image data"))
            .expect("DevTools sends base64");
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("screenshot written");
    }

    /// The errors the page logged since the last call, taken.
    pub fn take_errors(&mut self) -> Vec<String> {
        // Whatever arrived meanwhile first.
        while let Some(v) = self.read() {
            self.event(v);
        }
        std::mem::take(&mut self.errors)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
