//! The inspector in a real headless browser: Debian's `chromium` driven through `chromedriver`
//! (WebDriver) by `fantoccini`, against a started server on a real port with scripted sessions.
//! Without chromium or chromedriver these tests FAIL (`.ci/run` installs both: the Debian
//! packages `chromium` and `chromium-driver`).
//!
//! They sign in; find the session in the list; watch its model text arrive while the turn
//! runs; approve a pending call with a click and see the turn finish; count the timeline's
//! bars against the journal's steps and calls; time-travel to an earlier seq; check that a
//! viewer gets no decision buttons and its POSTs are refused, that another tenant sees nothing,
//! that a POST with the cookie and no CSRF token is refused, and that sign-out ends the session.
//! The SQLite run writes screenshots of every page at 1280 and 390 px to `docs/inspector/`.
//!
//! `flow`: the journey above, one scripted session from sign-in to sign-out; `pages`: what
//! each page draws beyond it (usage charts, the approval-wait bar, short-id search, look-alike
//! warnings, capped model text, the cancel confirmation, focus on page change, the slider).

mod effects;
mod flow;
mod pages;
mod withdrawn;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// A correctness deadline for what the page must show (wide: loaded CI machines).
const DEADLINE: Duration = Duration::from_secs(60);

/// A chromedriver this test started (killed on drop).
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn found(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

async fn driver() -> Driver {
    for program in ["chromedriver", "chromium"] {
        assert!(
            found(program),
            "`{program}` is not installed: the inspector's browser tests need Debian's chromium and \
             chromium-driver. Run .ci/run (it installs them) or `apt-get install chromium chromium-driver`."
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(r) = http.get(format!("{url}/status")).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["value"]["ready"] == true
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chromedriver never got ready on {url}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver {
        child,
        url,
        _profile: tempfile::tempdir().unwrap(),
    }
}

/// A fresh browser (its own profile: no cookies) at 1280 × 900.
async fn browser(d: &Driver) -> Client {
    browser_with(d, &[]).await
}

/// As [`browser`], with more chromium switches (`--force-dark-mode`: the system is dark).
async fn browser_with(d: &Driver, extra: &[&str]) -> Client {
    let profile = d
        ._profile
        .path()
        .join(uuid::Uuid::now_v7().simple().to_string());
    let mut caps = serde_json::Map::new();
    let mut args = vec![
        json!("--headless=new"),
        json!("--no-sandbox"),
        json!("--disable-gpu"),
        json!("--disable-dev-shm-usage"),
        json!("--window-size=1280,900"),
        json!("--hide-scrollbars"),
        json!("--force-color-profile=srgb"),
        json!(format!("--user-data-dir={}", profile.display())),
    ];
    args.extend(extra.iter().map(|a| json!(a)));
    caps.insert("goog:chromeOptions".into(), json!({ "args": args }));
    ClientBuilder::native()
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("a chromium session through chromedriver")
}

/// Clicks the element `css` names, found again if the page redrew it under the click.
async fn click(c: &Client, css: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let el = c
            .wait()
            .at_most(DEADLINE)
            .for_element(Locator::Css(css))
            .await
            .unwrap();
        match el.click().await {
            Ok(()) => return,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "{css} could not be clicked: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `js` (an expression) is truthy in the page; returns its value.
async fn until(c: &Client, what: &str, js: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let v = c
            .execute(
                &format!("try {{ return ({js}); }} catch (e) {{ return null; }}"),
                vec![],
            )
            .await
            .unwrap();
        let truthy = match &v {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            Value::Number(n) => n.as_f64() != Some(0.0),
            _ => true,
        };
        if truthy {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page never showed {what} ({js})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Evaluates `js` (statements ending in `return`) now.
async fn eval(c: &Client, js: &str) -> Value {
    c.execute(js, vec![]).await.unwrap()
}

/// A fetch made by the page itself (with its cookie): the status. `csrf`: send the page's token.
async fn page_post(c: &Client, path: &str, body: &Value, csrf: bool) -> u64 {
    let script = r#"
        const [path, body, csrf, done] = arguments;
        const headers = { 'Content-Type': 'application/json' };
        if (csrf) headers['X-Keel-CSRF'] = K.token();
        fetch(path, { method: 'POST', headers, body: JSON.stringify(body), credentials: 'same-origin' })
            .then((r) => done(r.status), (e) => done(String(e)));
    "#;
    c.execute_async(script, vec![json!(path), body.clone(), json!(csrf)])
        .await
        .unwrap()
        .as_u64()
        .unwrap_or(0)
}

async fn sign_in(c: &Client, base: &str, key: &str) {
    c.goto(&format!("{base}/")).await.unwrap();
    let input = c
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css("#key"))
        .await
        .unwrap();
    input.send_keys(key).await.unwrap();
    c.find(Locator::Css("#sign-in-button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(
        c,
        "the signed-in navigation",
        "!document.querySelector('#nav').hidden && K.me",
    )
    .await;
}

async fn go(c: &Client, base: &str, fragment: &str) {
    c.goto(&format!("{base}/{fragment}")).await.unwrap();
    until(
        c,
        "a signed-in page",
        "K.me && document.querySelector('#main h1')",
    )
    .await;
    // Review item 5: the new page's heading has the focus (keyboard and screen readers).
    until(
        c,
        "the focus on the heading",
        "document.activeElement === document.querySelector('#main h1')",
    )
    .await;
}

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/inspector")
}

/// Screenshots of the current page at 1280 and 390 px wide: `docs/inspector/<name>-<w>.png`.
async fn screenshot(c: &Client, write: bool, name: &str, ready: &str) {
    if !write {
        return;
    }
    std::fs::create_dir_all(shots()).unwrap();
    for (w, h) in [(1280, 900), (390, 844)] {
        c.set_window_size(w, h).await.unwrap();
        until(c, "the page at this width", ready).await;
        // Without a passing notice over it.
        eval(
            c,
            "document.querySelector('#toast').replaceChildren(); return true",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let png = c.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(shots().join(format!("{name}-{w}.png")), png).unwrap();
    }
    c.set_window_size(1280, 900).await.unwrap();
}
