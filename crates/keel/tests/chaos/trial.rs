//! One chaos trial on a running cluster: random scripted sessions, one fault, then the human's
//! part and the invariants (see the module docs of `chaos`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Rng;
use super::pg::PrivatePg;
use crate::postgres::Schema;
use crate::workers::{Cluster, Worker, delayed, shell};

/// Lease TTL of the chaos clusters (ms): a killed worker's sessions move on within about this.
const LEASE_TTL_MS: u64 = 1500;
/// Worker processes on PostgreSQL, each running up to this many sessions.
const WORKERS: usize = 2;
const CONCURRENCY: &str = "4";
/// How long a trial's sessions may take to end once the fault is over (a correctness bound
/// with a wide margin: each trial's work is a few seconds).
const SETTLE_SECS: u64 = 120;
/// How long a session may wait on a human without a reason the API shows before it counts as
/// unexplained (a reason appears in the same commit; this covers reading mid-way).
const REASON_GRACE: Duration = Duration::from_secs(5);

/// The fault a trial injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// SIGKILL of a `keel worker` on PostgreSQL (the one holding a trial session's lease,
    /// preferably with a call dispatched), then a new worker.
    PgKill,
    /// PostgreSQL stopped like a crash (`-m immediate`) for up to 2 s and started again; half
    /// the time a worker is killed too.
    PgRestart,
    /// An extra worker whose clock is 1 to 5 minutes ahead or behind; half the time a normal
    /// worker is killed too.
    ClockSkew,
    /// SIGKILL of `keel serve` (its in-process workers) on the SQLite store, then a new one.
    SqliteKill,
    /// The disk under the SQLite store fills up (`disk.rs`).
    DiskFull,
}

/// What the trials counted; `problems` names every broken invariant.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) trials: u64,
    /// SIGKILLs that landed on a live worker process.
    pub(super) kills: u64,
    /// … of which the victim had a trial call dispatched (its effect in flight).
    pub(super) kills_mid_call: u64,
    pub(super) pg_restarts: u64,
    pub(super) skewed: u64,
    /// Disk-full trials in which the disk did fill (the error was seen).
    pub(super) disk_full: u64,
    pub(super) sessions: u64,
    /// Effects (tool calls appending a token) the sessions were scripted to make.
    pub(super) effects: u64,
    /// `outcome_unknown` effects decided as the human.
    pub(super) decisions: u64,
    pub(super) duplicates: u64,
    pub(super) lost_effects: u64,
    pub(super) lost_events: u64,
    pub(super) stuck: u64,
    pub(super) unexplained: u64,
    pub(super) bad_turns: u64,
    problems: Vec<String>,
}

impl Tally {
    /// Every broken invariant so far, one line each.
    pub(super) fn problems(&self) -> &[String] {
        &self.problems
    }

    pub(super) fn problem(&mut self, what: String) {
        eprintln!("chaos: PROBLEM {what}");
        self.problems.push(what);
    }
}

/// The clusters, started on first use and kept across trials.
pub(super) struct World {
    pg: Option<PgWorld>,
    sqlite: Option<Cluster>,
}

/// Workers first: fields drop in order, and the schema (in the cluster) and the server last.
struct PgWorld {
    workers: Vec<Worker>,
    cluster: Cluster,
    server: PrivatePg,
}

impl World {
    pub(super) fn new() -> Self {
        World {
            pg: None,
            sqlite: None,
        }
    }

    /// Runs trial `i` of `kind` (any but `DiskFull`); a line saying what happened.
    pub(super) fn trial(&mut self, kind: Kind, i: u64, rng: &mut Rng, tally: &mut Tally) -> String {
        if kind == Kind::SqliteKill {
            let c = self
                .sqlite
                .get_or_insert_with(|| Cluster::sqlite_with_ttl(LEASE_TTL_MS));
            return sqlite_trial(c, i, rng, tally);
        }
        let w = self.pg.get_or_insert_with(|| {
            let server = PrivatePg::start();
            let cluster = Cluster::postgres_on(Schema::on(&server.url()), LEASE_TTL_MS);
            let workers = (0..WORKERS)
                .map(|_| cluster.worker(&["--concurrency", CONCURRENCY]))
                .collect();
            PgWorld {
                workers,
                cluster,
                server,
            }
        });
        w.trial(kind, i, rng, tally)
    }
}

impl PgWorld {
    fn trial(&mut self, kind: Kind, i: u64, rng: &mut Rng, tally: &mut Tally) -> String {
        let mut note = String::new();
        let skewed = (kind == Kind::ClockSkew).then(|| {
            let ms = rng.range(60_000, 300_000) as i64 * if rng.chance(50) { 1 } else { -1 };
            tally.skewed += 1;
            note.push_str(&format!("worker clock {ms:+} ms; "));
            self.cluster.worker_with_env(
                &["--concurrency", CONCURRENCY],
                &[("KEEL_CLOCK_SKEW_MS", ms.to_string())],
            )
        });
        let plan = Plan::new(i, rng);
        let sessions = self.cluster.start_turns(&plan.scripts);
        plan.count(tally);
        std::thread::sleep(Duration::from_millis(rng.range(100, 1500)));
        let mut committed = None;
        match kind {
            Kind::PgKill => self.kill(&sessions, rng, tally, &mut note),
            Kind::PgRestart => {
                committed = Some(self.committed(&sessions));
                let outage = Duration::from_millis(rng.range(0, 2000));
                let down = self.server.crash_restart(outage);
                tally.pg_restarts += 1;
                note.push_str(&format!("PostgreSQL down {} ms; ", down.as_millis()));
                if rng.chance(50) {
                    self.kill(&sessions, rng, tally, &mut note);
                }
            }
            Kind::ClockSkew => {
                if rng.chance(50) {
                    self.kill(&sessions, rng, tally, &mut note);
                }
            }
            Kind::SqliteKill | Kind::DiskFull => unreachable!("not a PostgreSQL trial"),
        }
        self.keep_alive(tally, &mut note);
        settle(&self.cluster, &sessions, &plan, tally, &mut note);
        if let Some(before) = committed {
            let after = self.committed(&sessions);
            for (session, events) in &before {
                let now = after.get(session).map_or(&[][..], Vec::as_slice);
                if !now.starts_with(events) {
                    tally.lost_events += 1;
                    tally.problem(format!(
                        "trial {i}: session {session} lost committed events in the PostgreSQL crash: \
                         before {events:?}, after {:?}… (a prefix expected)",
                        &now[..now.len().min(events.len() + 2)]
                    ));
                }
            }
        }
        if let Some(mut w) = skewed {
            let took = w
                .run
                .stderr_lines()
                .iter()
                .filter(|l| l.contains("took over"))
                .count();
            note.push_str(&format!("the skewed worker took over {took} leases; "));
            w.run.signal("TERM");
            let t = Instant::now();
            while w.run.child.try_wait().unwrap().is_none() {
                if t.elapsed() > Duration::from_secs(60) {
                    tally.problem(format!(
                        "trial {i}: the skewed worker did not drain in 60 s"
                    ));
                    w.kill_9();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let fenced: usize = self
            .workers
            .iter()
            .map(|w| {
                w.run
                    .stderr_lines()
                    .iter()
                    .filter(|l| l.contains("lease lost"))
                    .count()
            })
            .sum();
        note.push_str(&format!("runs fenced so far (lease lost): {fenced}; "));
        verify(&self.cluster, &sessions, &plan, i, tally);
        note
    }

    /// Kills (SIGKILL) the worker holding a lease of one of `sessions` — waiting up to 3 s
    /// for one with a call dispatched — and starts a new worker in its place.
    fn kill(&mut self, sessions: &[String], rng: &mut Rng, tally: &mut Tally, note: &mut String) {
        let list = sessions
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(",");
        let t = Instant::now();
        let (victim, mid_call) = loop {
            let rows = self.cluster.try_rows(&format!(
                "SELECT s.lease_owner, \
                 (SELECT count(*) FROM effects e WHERE e.session_id = s.session_id AND e.status = 'dispatched')::text \
                 FROM sessions s WHERE s.session_id IN ({list}) AND s.lease_owner IS NOT NULL"
            ));
            let holders: Vec<(usize, bool)> = rows
                .iter()
                .filter_map(|r| {
                    let owner = r[0].as_deref()?;
                    let idx = self.workers.iter().position(|w| w.owns(owner))?;
                    Some((idx, r[1].as_deref() != Some("0")))
                })
                .collect();
            if let Some(&h) = holders.iter().find(|h| h.1) {
                break h;
            }
            if t.elapsed() > Duration::from_secs(3) {
                match holders.first() {
                    Some(&h) => break h,
                    None => break (rng.range(0, WORKERS as u64 - 1) as usize, false),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let w = &mut self.workers[victim];
        let alive = w.run.child.try_wait().unwrap().is_none();
        w.kill_9();
        if alive {
            tally.kills += 1;
            if mid_call {
                tally.kills_mid_call += 1;
            }
        }
        note.push_str(&format!(
            "killed worker {} ({}); ",
            w.pid(),
            if mid_call {
                "a call in flight"
            } else {
                "no call in flight"
            }
        ));
        self.workers[victim] = self.cluster.worker(&["--concurrency", CONCURRENCY]);
    }

    /// A worker that exited on its own (it should wait out a database outage, not die) is a
    /// problem; it is replaced so the run goes on.
    fn keep_alive(&mut self, tally: &mut Tally, note: &mut String) {
        for k in 0..self.workers.len() {
            if let Some(status) = self.workers[k].run.child.try_wait().unwrap() {
                let tail = self.workers[k].run.stderr_lines();
                let tail = tail[tail.len().saturating_sub(5)..].join("\n");
                tally.problem(format!("a worker exited on its own ({status}): {tail}"));
                note.push_str("a worker died and was replaced; ");
                self.workers[k] = self.cluster.worker(&["--concurrency", CONCURRENCY]);
            }
        }
    }

    /// Each session's committed events, `(seq, type)` in order.
    fn committed(&self, sessions: &[String]) -> BTreeMap<String, Vec<(String, String)>> {
        let list = sessions
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(",");
        let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for r in self.cluster.try_rows(&format!(
            "SELECT session_id, seq::text, type FROM events WHERE session_id IN ({list}) \
             ORDER BY events.session_id, events.seq"
        )) {
            if let [Some(s), Some(seq), Some(ty)] = &r[..] {
                out.entry(s.clone())
                    .or_default()
                    .push((seq.clone(), ty.clone()));
            }
        }
        out
    }
}

/// A trial on the embedded SQLite store: `keel serve` (API and workers in one process) is
/// killed with SIGKILL while the sessions run, and started again on the same file.
fn sqlite_trial(c: &mut Cluster, i: u64, rng: &mut Rng, tally: &mut Tally) -> String {
    let mut note = String::new();
    let plan = Plan::new(i, rng);
    let sessions = c.start_turns(&plan.scripts);
    plan.count(tally);
    // Wait (≤ 3 s) for a call in flight, then kill.
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(rng.range(100, 1200)));
    let mid_call = loop {
        let dispatched = sessions.iter().any(|s| {
            c.block_on(c.client.list_effects(s, Some("dispatched")))
                .is_ok_and(|e| !e.is_empty())
        });
        if dispatched || t.elapsed() > Duration::from_secs(3) {
            break dispatched;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let alive = c.api.alive();
    c.api.restart(&c.env, &[]);
    c.reconnect();
    if alive {
        tally.kills += 1;
        if mid_call {
            tally.kills_mid_call += 1;
        }
    }
    note.push_str(&format!(
        "killed keel serve ({}); ",
        if mid_call {
            "a call in flight"
        } else {
            "no call in flight"
        }
    ));
    settle(c, &sessions, &plan, tally, &mut note);
    verify(c, &sessions, &plan, i, tally);
    note
}

/// The sessions of a trial: 1 to 3, each 1 to 3 `shell` calls appending a unique token to
/// `effects.txt` (with random pauses before and after, so a kill lands before, during or after
/// the effect), then an answer.
struct Plan {
    scripts: Vec<(String, Vec<Value>)>,
    /// Per session (in order), its calls' tokens.
    tokens: Vec<Vec<String>>,
}

impl Plan {
    fn new(i: u64, rng: &mut Rng) -> Self {
        let mut scripts = Vec::new();
        let mut tokens = Vec::new();
        for s in 0..rng.range(1, 3) {
            let mut lines = Vec::new();
            let mut mine = Vec::new();
            for k in 0..rng.range(1, 3) {
                let token = format!("tok-{i}-{s}-{k}");
                let command = format!(
                    "sleep 0.{}; echo {token} >> effects.txt; sleep 0.{}",
                    rng.range(0, 4),
                    rng.range(0, 6)
                );
                lines.push(delayed(rng.range(0, 200), shell(&command)));
                mine.push(token);
            }
            lines.push(json!({"text": format!("trial {i} session {s} done")}));
            scripts.push((format!("c{i}s{s}"), lines));
            tokens.push(mine);
        }
        Plan { scripts, tokens }
    }

    fn count(&self, tally: &mut Tally) {
        tally.sessions += self.tokens.len() as u64;
        tally.effects += self.tokens.iter().map(|t| t.len() as u64).sum::<u64>();
    }
}

/// Acts as the human until every session is idle (≤ [`SETTLE_SECS`]): each `outcome_unknown`
/// effect is decided `committed` when its token is in the effect file, else `retry`. A session
/// waiting on a human with neither such an effect nor a pending approval for longer than
/// [`REASON_GRACE`] is counted unexplained; one not idle at the end, stuck.
fn settle(c: &Cluster, sessions: &[String], plan: &Plan, tally: &mut Tally, note: &mut String) {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_SECS);
    let mut decided: HashSet<String> = HashSet::new();
    let mut reasonless: HashMap<String, Instant> = HashMap::new();
    let mut flagged: HashSet<String> = HashSet::new();
    let tokens: Vec<&String> = plan.tokens.iter().flatten().collect();
    let mut human = 0;
    loop {
        let mut open = Vec::new();
        for s in sessions {
            let status = match c.block_on(c.client.get_session(s)) {
                Ok(b) => b.status,
                Err(_) => {
                    open.push(s.clone());
                    continue;
                }
            };
            if status == "idle" {
                continue;
            }
            open.push(s.clone());
            if status != "requires_action" {
                reasonless.remove(s);
                continue;
            }
            let effects = c
                .block_on(c.client.list_effects(s, Some("outcome_unknown")))
                .unwrap_or_default();
            let approvals = c
                .block_on(c.client.session_approvals(s, Some("pending")))
                .unwrap_or_default();
            if effects.is_empty() && approvals.is_empty() {
                let since = *reasonless.entry(s.clone()).or_insert_with(Instant::now);
                if since.elapsed() > REASON_GRACE && flagged.insert(s.clone()) {
                    tally.unexplained += 1;
                    tally.problem(format!(
                        "session {s} waits on a human with no outcome_unknown effect or pending approval"
                    ));
                }
                continue;
            }
            reasonless.remove(s);
            let events = c.block_on(c.client.events(s, 0)).unwrap_or_default();
            let lines = effect_lines(c);
            for e in effects {
                if decided.contains(&e.operation_key) {
                    continue;
                }
                let Some(token) = token_of_call(&events, &e.tool_call_id, &tokens) else {
                    continue; // the events are read again next round
                };
                let decision = if lines.iter().any(|l| l == token) {
                    keel_client::api::EffectDecisionParam::Committed
                } else {
                    keel_client::api::EffectDecisionParam::Retry
                };
                if c.block_on(c.client.decide_effect(
                    s,
                    &e.operation_key,
                    decision,
                    Some("chaos trial: decided from the effect file"),
                ))
                .is_ok()
                {
                    decided.insert(e.operation_key.clone());
                    tally.decisions += 1;
                    human += 1;
                }
            }
            for a in approvals {
                tally.problem(format!(
                    "session {s}: an approval nobody asked for ({})",
                    a.approval_id
                ));
            }
        }
        if open.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for s in &open {
                tally.stuck += 1;
                let last: Vec<String> = c
                    .block_on(c.client.events(s, 0))
                    .unwrap_or_default()
                    .iter()
                    .rev()
                    .take(5)
                    .map(|e| e["type"].to_string())
                    .collect();
                tally.problem(format!(
                    "session {s} not idle {SETTLE_SECS} s after the fault; its last events: {last:?}"
                ));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if human > 0 {
        note.push_str(&format!("{human} outcome_unknown decided; "));
    }
}

/// The token of call `call` of the session (from the journal: the event carrying its
/// arguments).
fn token_of_call<'a>(events: &[Value], call: &str, tokens: &[&'a String]) -> Option<&'a String> {
    events
        .iter()
        .map(Value::to_string)
        .filter(|e| e.contains(call))
        .find_map(|e| {
            tokens
                .iter()
                .find(|t| e.contains(&format!("echo {t} ")))
                .copied()
        })
}

/// The lines of the shared effect file.
fn effect_lines(c: &Cluster) -> Vec<String> {
    c.lines_of("effects.txt")
}

/// The invariants once every session is idle: each token in the effect file exactly once
/// (twice: a duplicate effect; never: an effect lost), one `turn.finished`, `completed`, per
/// session.
fn verify(c: &Cluster, sessions: &[String], plan: &Plan, i: u64, tally: &mut Tally) {
    let lines = effect_lines(c);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in &lines {
        *counts.entry(l.as_str()).or_default() += 1;
    }
    for token in plan.tokens.iter().flatten() {
        match counts.get(token.as_str()).copied().unwrap_or(0) {
            1 => {}
            0 => {
                tally.lost_effects += 1;
                tally.problem(format!("trial {i}: effect {token} never happened"));
            }
            n => {
                tally.duplicates += 1;
                tally.problem(format!("trial {i}: effect {token} happened {n} times"));
            }
        }
    }
    for s in sessions {
        let finished: Vec<Value> = c
            .block_on(c.client.events(s, 0))
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["type"] == "turn.finished")
            .collect();
        let ok = finished.len() == 1 && finished[0]["payload"]["terminal_reason"] == "completed";
        if !ok {
            tally.bad_turns += 1;
            let reasons: Vec<String> = finished
                .iter()
                .map(|e| e["payload"]["terminal_reason"].to_string())
                .collect();
            tally.problem(format!(
                "trial {i}: session {s} has turn.finished {reasons:?} (one, completed, expected)"
            ));
        }
    }
}
