//! A headless Chromium driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: JSON messages ending in a NUL byte, on the
//! browser's file descriptors 3 and 4). No web driver and no WebSocket:
//! the page's own JavaScript runs, and clicks and typing are the input
//! events a user's mouse and keyboard make.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The browser the tests drive (Debian's `chromium` package).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one protocol call may take.
const CALL: Duration = Duration::from_secs(30);
/// How long [`Browser::wait_for`] waits for the page to show something.
pub const PATIENCE: Duration = Duration::from_secs(30);

type Replies = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// One headless Chromium with one page open, in a profile folder of its
/// own; its whole process group is ended when this is dropped.
pub struct Browser {
    child: Child,
    to_browser: Mutex<std::fs::File>,
    replies: Replies,
    console: Arc<Mutex<Vec<String>>>,
    next: AtomicU64,
    session: String,
    profile: PathBuf,
    /// Closed by `Browser.close`: it is ending by itself.
    closed: bool,
}

impl Browser {
    /// Start Chromium and open `url` in a page; returns once the page has
    /// loaded.
    pub async fn open(url: &str) -> Browser {
        let profile = std::env::temp_dir().join(format!(
            "coord-ui-browser-{}-{}",
            std::process::id(),
            super::unique("profile")
        ));
        std::fs::create_dir_all(&profile).expect("make the browser's profile folder");
        // Ours: write `to_browser`, read `from_browser`. The browser's
        // ends become its descriptors 3 (it reads) and 4 (it writes).
        let (browser_reads, to_browser) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let (from_browser, browser_writes) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let (r, w) = (browser_reads.as_raw_fd(), browser_writes.as_raw_fd());
        let mut cmd = Command::new(CHROMIUM);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--password-store=basic",
            "--window-size=1280,900",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
        // SAFETY: only fcntl and dup2 between fork and exec (both
        // async-signal-safe); the descriptors stay open in the parent
        // until the spawn returned.
        unsafe {
            cmd.pre_exec(move || {
                // Out of the way of 3 and 4 first, then onto them (dup2
                // clears close-on-exec on the copy).
                let r = fcntl(BorrowedFd::borrow_raw(r), FcntlArg::F_DUPFD_CLOEXEC(10))?;
                let w = fcntl(BorrowedFd::borrow_raw(w), FcntlArg::F_DUPFD_CLOEXEC(10))?;
                let _ = nix::unistd::dup2_raw(BorrowedFd::borrow_raw(r), 3)?.into_raw_fd();
                let _ = nix::unistd::dup2_raw(BorrowedFd::borrow_raw(w), 4)?.into_raw_fd();
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .expect("start chromium (apt-get install chromium)");
        drop((browser_reads, browser_writes));
        let replies: Replies = Arc::default();
        let console: Arc<Mutex<Vec<String>>> = Arc::default();
        let (r2, c2) = (replies.clone(), console.clone());
        let from_browser = std::fs::File::from(from_browser);
        std::thread::spawn(move || read_messages(from_browser, r2, c2));
        let mut b = Browser {
            child,
            to_browser: Mutex::new(std::fs::File::from(to_browser)),
            replies,
            console,
            next: AtomicU64::new(1),
            session: String::new(),
            profile,
            closed: false,
        };
        let target = b
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let target = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = b
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
            )
            .await;
        b.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        b.page("Runtime.enable", json!({})).await;
        b.page("Page.enable", json!({})).await;
        b.goto(url).await;
        b
    }

    /// Load `url` in the page and wait until it has loaded.
    pub async fn goto(&self, url: &str) {
        let r = self.page("Page.navigate", json!({"url": url})).await;
        assert!(r.get("errorText").is_none(), "cannot load {url}: {r}");
        self.wait_for("the page to load", "document.readyState === 'complete'")
            .await;
    }

    /// Call `method` of the page's session.
    pub async fn page(&self, method: &str, params: Value) -> Value {
        self.call(Some(&self.session), method, params).await
    }

    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let (tx, rx) = oneshot::channel();
        self.replies.lock().unwrap().insert(id, tx);
        {
            let mut out = self.to_browser.lock().unwrap();
            let mut bytes = msg.to_string().into_bytes();
            bytes.push(0);
            out.write_all(&bytes).expect("write to chromium");
        }
        let reply = tokio::time::timeout(CALL, rx)
            .await
            .unwrap_or_else(|_| panic!("chromium did not answer {method} within {CALL:?}"))
            .unwrap_or_else(|_| panic!("chromium exited during {method}"));
        if let Some(e) = reply.get("error") {
            panic!("{method} failed: {e}");
        }
        reply["result"].clone()
    }

    /// The value of the JavaScript expression `js` in the page (promises
    /// awaited); panics on an exception.
    pub async fn eval(&self, js: &str) -> Value {
        let r = self
            .page(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js} threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Evaluate `js` until it gives something other than `null`, `false`
    /// or nothing, within [`PATIENCE`]; that value. Panics naming `what`,
    /// with what the page logged.
    pub async fn wait_for(&self, what: &str, js: &str) -> Value {
        let end = tokio::time::Instant::now() + PATIENCE;
        loop {
            let v = self.eval(js).await;
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            if tokio::time::Instant::now() >= end {
                panic!(
                    "the page did not show {what} within {PATIENCE:?}; its text:\n{}\nits console:\n{}",
                    self.eval("document.body.innerText").await,
                    self.console()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Click the middle of the element `element` (a JavaScript expression)
    /// with the mouse, as a user does.
    pub async fn click(&self, element: &str) {
        let at = self
            .wait_for(
                &format!("{element} on screen"),
                &format!(
                    "(() => {{ const e = {element}; if (!e || e.disabled) return null;
                        e.scrollIntoView({{block: 'center'}});
                        const r = e.getBoundingClientRect();
                        const x = r.x + r.width / 2, y = r.y + r.height / 2;
                        const top = document.elementFromPoint(x, y);
                        return top && (top === e || e.contains(top)) ? [x, y] : null; }})()"
                ),
            )
            .await;
        let (x, y) = (at[0].clone(), at[1].clone());
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.page(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )
            .await;
        }
    }

    /// Click the input `element` and type `text` into it.
    pub async fn type_into(&self, element: &str, text: &str) {
        self.click(element).await;
        self.eval(&format!("{element}.select()")).await;
        self.page("Input.insertText", json!({"text": text})).await;
    }

    /// What the page wrote to its console, and its uncaught exceptions.
    pub fn console(&self) -> String {
        self.console.lock().unwrap().join("\n")
    }

    /// Close the browser (its process group is ended on drop either way).
    pub async fn close(mut self) {
        let closing = self.call(None, "Browser.close", json!({}));
        if tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .is_ok()
        {
            self.closed = true;
        }
    }
}

impl Drop for Browser {
    /// Ask the browser to end (SIGTERM to it alone: it ends its own
    /// processes) unless it was closed, give it 10 s, then SIGKILL what is
    /// left of its process group.
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        let signal = nix::sys::signal::kill;
        if !self.closed {
            let _ = signal(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let group = nix::unistd::Pid::from_raw(-pid);
        let _ = signal(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Read the browser's messages until it closes its end: replies go to
/// their callers, console messages and exceptions to `console`.
fn read_messages(from: std::fs::File, replies: Replies, console: Arc<Mutex<Vec<String>>>) {
    let mut from = BufReader::new(from);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match from.read_until(0, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() == Some(&0) {
            buf.pop();
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        if let Some(id) = msg["id"].as_u64() {
            if let Some(tx) = replies.lock().unwrap().remove(&id) {
                let _ = tx.send(msg);
            }
            continue;
        }
        let params = &msg["params"];
        let line = match msg["method"].as_str() {
            Some("Runtime.consoleAPICalled") => Some(format!(
                "console.{}: {}",
                params["type"].as_str().unwrap_or("?"),
                params["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a["value"].to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
            Some("Runtime.exceptionThrown") => Some(format!(
                "exception: {}",
                params["exceptionDetails"]["exception"]["description"]
            )),
            _ => None,
        };
        if let Some(line) = line {
            console.lock().unwrap().push(line);
        }
    }
    // The browser is gone: every caller still waiting learns it.
    replies.lock().unwrap().clear();
}
