//! Distributed locks and rate limiters against real redis-servers: exclusion under racing
//! acquirers, strictly rising fencing tokens, the watchdog, Redlock with servers down, and each
//! limiter's promise checked from recorded grant times.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardctl_common::conn;
use shardctl_common::limiter::{Decision, Limiter};
use shardctl_common::lock::{LockKeys, RedisLock, Redlock};
use shardctl_testkit::TestRedis;

async fn manager(r: &TestRedis) -> shardctl_common::conn::Conn {
    conn::open(&r.url()).unwrap().manager().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_racing_acquirers_hold_one_at_a_time_with_rising_fences() {
    let r = TestRedis::start();
    let con = manager(&r).await;
    let lock = RedisLock::new(con, LockKeys::new("t", "race").unwrap(), Duration::from_secs(5));
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (lock, inside, most, fences) = (lock.clone(), inside.clone(), most.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let lease = lock.acquire(Duration::from_secs(30)).await.unwrap().expect("acquired within the wait");
            let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            // recorded while held: the vector's order is the order of acquisition
            fences.lock().unwrap().push(lease.fencing_token);
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            assert!(lock.release(&lease).await.unwrap(), "the holder releases its own lock");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    let f = fences.lock().unwrap().clone();
    assert_eq!(f.len(), 50);
    assert!(f.windows(2).all(|w| w[0] < w[1]), "fencing tokens must rise strictly: {f:?}");
}

#[tokio::test]
async fn watchdog_keeps_the_lock_and_reports_its_loss() {
    let r = TestRedis::start();
    let con = manager(&r).await;
    let keys = LockKeys::new("t", "dog").unwrap();
    let lock = RedisLock::new(con.clone(), keys.clone(), Duration::from_millis(300));
    let lease = lock.try_acquire().await.unwrap().unwrap();
    // held three TTLs long through the watchdog; another acquirer is refused meanwhile
    let other = RedisLock::new(con.clone(), keys.clone(), Duration::from_millis(300));
    let stop = tokio::time::sleep(Duration::from_millis(900));
    let (held, refused) = tokio::join!(lock.watchdog(&lease, stop), other.acquire(Duration::from_millis(800)));
    assert!(held.is_ok(), "{held:?}");
    assert_eq!(refused.unwrap(), None, "the lock was taken while the watchdog renewed it");
    // a stale release is refused; the lock is lost when someone deletes it
    assert!(!other.release(&shardctl_common::lock::Lease { token: "nope".into(), ..lease.clone() }).await.unwrap());
    let mut c = r.con();
    let _: () = redis::cmd("DEL").arg(&keys.lock).query(&mut c).unwrap();
    let lost = lock.watchdog(&lease, std::future::pending()).await;
    assert!(
        matches!(&lost, Err(shardctl_common::Error::LockLost(k)) if *k == keys.lock),
        "a lost lock is its own error: {lost:?}"
    );
    assert!(LockKeys::new("t", "bad name").is_err());

    // Redis unreachable: renewals fail, and once a whole TTL passed without one the lease has run
    // out (another may hold the lock by now): lost, not retried forever
    let lease = lock.try_acquire().await.unwrap().unwrap();
    let mut r = r;
    r.stop();
    let since = std::time::Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(10), lock.watchdog(&lease, std::future::pending()))
        .await
        .expect("the watchdog must give up once the TTL ran out");
    assert!(matches!(&lost, Err(shardctl_common::Error::LockLost(_))), "{lost:?}");
    assert!(since.elapsed() >= Duration::from_millis(300), "lost before its TTL ran out: {:?}", since.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_survives_two_of_five_down_and_refuses_with_three() {
    let mut servers: Vec<TestRedis> = (0..5).map(|_| TestRedis::start()).collect();
    let mut cons = Vec::new();
    for s in &servers {
        cons.push(manager(s).await);
    }
    let keys = LockKeys::new("t", "red").unwrap();
    let ttl = Duration::from_secs(2);
    let lock = Redlock::new(cons, keys.clone(), ttl);
    let mut fences = Vec::new();

    let a = lock.try_acquire().await.unwrap().expect("all five up");
    assert!(a.validity <= ttl && a.validity > Duration::ZERO);
    assert_eq!(lock.try_acquire().await.unwrap(), None, "exclusion across the quorum");
    fences.push(a.fencing_token);
    lock.release(&a).await.unwrap();

    servers[0].stop();
    servers[1].stop();
    let b = lock.acquire(Duration::from_secs(5)).await.unwrap().expect("3 of 5 is a quorum");
    assert!(lock.extend(&b).await.unwrap(), "a quorum extends");
    fences.push(b.fencing_token);
    lock.release(&b).await.unwrap();

    servers[2].stop();
    assert_eq!(lock.acquire(Duration::from_millis(500)).await.unwrap(), None, "2 of 5 is no quorum");

    // back to 4 of 5 (two restarted empty): fences still rise, read from the quorum's highest
    servers[0].restart();
    servers[2].restart();
    let c = lock.acquire(Duration::from_secs(10)).await.unwrap().expect("4 of 5 up");
    fences.push(c.fencing_token);
    lock.release(&c).await.unwrap();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fencing tokens must rise: {fences:?}");
}

async fn managers(servers: &[TestRedis]) -> Vec<shardctl_common::conn::Conn> {
    let mut cons = Vec::new();
    for s in servers {
        cons.push(manager(s).await);
    }
    cons
}

/// Issue 11, defect 3: a Redlock holder paused between taking the quorum and raising the fence
/// (GC, swap, SIGSTOP) past its validity. Meanwhile its keys expire and B takes the lock. The
/// paused attempt must not come back as a lease: it would carry a fence at least as new as B's
/// (before the fix: B's plus one) and the guarded resource would accept the expired holder and
/// refuse the current one. The ordering is forced by the test hook, not by timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_holder_paused_past_its_validity_is_not_handed_a_fence() {
    let servers: Vec<TestRedis> = (0..3).map(|_| TestRedis::start()).collect();
    let cons = managers(&servers).await;
    let keys = LockKeys::new("t", "pause").unwrap();
    let (paused_tx, mut paused) = tokio::sync::mpsc::unbounded_channel::<()>();
    let resume = Arc::new(tokio::sync::Notify::new());
    let resumed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (gate, flag) = (resume.clone(), resumed.clone());
    let a = Redlock::new(cons.clone(), keys.clone(), Duration::from_secs(1)).pause_before_fence(move || {
        let (tx, gate, flag) = (paused_tx.clone(), gate.clone(), flag.clone());
        async move {
            let _ = tx.send(());
            gate.notified().await;
            flag.store(true, Ordering::SeqCst);
        }
    });
    let a_attempt = tokio::spawn(async move {
        // retried until an attempt reaches the pause (only one with the lock on a quorum does)
        loop {
            let r = a.try_acquire().await.unwrap();
            if r.is_some() || resumed.load(Ordering::SeqCst) {
                return r;
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), paused.recv()).await.expect("A took the quorum").unwrap();
    // A is paused holding the quorum; wait (without a clock) until its keys expired everywhere
    let expired = || servers.iter().all(|s| !redis::cmd("EXISTS").arg(&keys.lock).query::<bool>(&mut s.con()).unwrap());
    shardctl_testkit::eventually_async("A's keys to expire", Duration::from_secs(30), || async { expired() }).await;
    let b_lock = Redlock::new(cons.clone(), keys.clone(), Duration::from_secs(30));
    let b = b_lock.acquire(Duration::from_secs(10)).await.unwrap().expect("A's keys expired: B takes the lock");
    resume.notify_one();
    let a = a_attempt.await.unwrap();
    if let Some(a) = &a {
        panic!(
            "the paused attempt was returned although its validity was spent: A (took the lock first) has fence {}, \
             B (took it after A's keys expired) has fence {}; validity reported {:?}",
            a.fencing_token, b.fencing_token, a.validity
        );
    }
    // giving up did not touch B's keys: B still holds the lock on every server
    for s in &servers {
        let holder: Option<String> = redis::cmd("GET").arg(&keys.lock).query(&mut s.con()).unwrap();
        assert_eq!(holder.as_deref(), Some(b.token.as_str()), "A's give-up released B's lock");
    }
    // successive holders' fences only grow: C after B
    b_lock.release(&b).await.unwrap();
    let c = Redlock::new(cons, keys, Duration::from_secs(5)).acquire(Duration::from_secs(10)).await.unwrap().unwrap();
    assert!(c.fencing_token > b.fencing_token, "fences must rise: B {} then C {}", b.fencing_token, c.fencing_token);
}

/// The validity of a Redlock lease is measured from before the lock was taken, so the time spent
/// raising the fence (here: a 100 ms pause at that moment) is taken off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_validity_counts_the_time_spent_raising_the_fence() {
    let servers: Vec<TestRedis> = (0..3).map(|_| TestRedis::start()).collect();
    let cons = managers(&servers).await;
    let ttl = Duration::from_secs(2);
    let pause = Duration::from_millis(100);
    let lock = Redlock::new(cons, LockKeys::new("t", "valid").unwrap(), ttl)
        .pause_before_fence(move || tokio::time::sleep(pause));
    let lease = lock.acquire(Duration::from_secs(10)).await.unwrap().expect("all three up");
    assert!(lease.validity > Duration::ZERO);
    assert!(
        lease.validity <= ttl - pause,
        "validity {:?} ignores the {pause:?} spent before the fence was raised (ttl {ttl:?})",
        lease.validity
    );
}

/// Deterministic gaps between requests (0 to `max_gap_ms`), by a xorshift.
fn gaps(n: usize, max_gap_ms: u64, seed: u64) -> Vec<u64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % (max_gap_ms + 1)
        })
        .collect()
}

/// Sends one request after each gap, three clients taking turns as three executors would; the
/// times of the grants (the server's clock, as the limiter decided them) and of all requests.
async fn grants(limiter: Limiter, key: &str, r: &TestRedis, gaps: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let mut cons = Vec::new();
    for _ in 0..3 {
        cons.push(manager(r).await);
    }
    let (mut granted, mut asked) = (Vec::new(), Vec::new());
    for (i, &gap) in gaps.iter().enumerate() {
        if gap > 0 {
            tokio::time::sleep(Duration::from_millis(gap)).await;
        }
        let (d, at) = limiter.acquire_timed(&mut cons[i % 3], key, &format!("req-{i}")).await.unwrap();
        asked.push(at);
        match d {
            Decision::Granted => granted.push(at),
            Decision::Wait(w) => assert!(w > Duration::ZERO),
        }
    }
    (granted, asked)
}

#[tokio::test]
async fn fixed_window_never_grants_more_than_max_per_window() {
    let r = TestRedis::start();
    let per = 50u64;
    let (g, _) =
        grants(Limiter::FixedWindow { max: 5, per: Duration::from_millis(per) }, "{t}:fixed", &r, &gaps(600, 4, 7))
            .await;
    let mut by_window = std::collections::HashMap::<u64, u64>::new();
    for t in &g {
        *by_window.entry(t / per).or_default() += 1;
    }
    assert!(by_window.values().all(|&n| n <= 5), "{by_window:?}");
    assert!(by_window.values().filter(|&&n| n == 5).count() > 10, "the limiter must grant up to its limit");
}

#[tokio::test]
async fn sliding_log_never_grants_more_than_max_in_any_window() {
    let r = TestRedis::start();
    let per = 50u64;
    let (g, _) =
        grants(Limiter::SlidingLog { max: 5, per: Duration::from_millis(per) }, "{t}:slide", &r, &gaps(600, 4, 11))
            .await;
    for (i, &t) in g.iter().enumerate() {
        // grants in (t - per, t]
        let n = g[..=i].iter().filter(|&&u| u + per > t).count();
        assert!(n <= 5, "{n} grants in the window ending at {t}");
    }
    assert!(g.len() > 50, "the limiter must grant up to its limit: {}", g.len());
}

#[tokio::test]
async fn token_bucket_bounds_bursts_and_the_long_run_rate() {
    let r = TestRedis::start();
    let (capacity, rate) = (10u64, 50.0);
    // a burst without pauses: the capacity, and at most what refilled meanwhile
    let (g, asked) = grants(Limiter::TokenBucket { capacity, rate }, "{t}:burst", &r, &[0; 25]).await;
    let refilled = (asked[asked.len() - 1] - asked[0]) as f64 * rate / 1000.0;
    assert!(g.len() as u64 >= capacity, "a full bucket grants its capacity at once: {}", g.len());
    assert!(g.len() as f64 <= capacity as f64 + refilled + 1.0, "{} grants in a burst", g.len());
    // over ~1.5 s of dense requests: at most capacity + rate × span
    let (g, at) = grants(Limiter::TokenBucket { capacity, rate }, "{t}:rate", &r, &gaps(600, 4, 13)).await;
    let span = (at[at.len() - 1] - at[0]) as f64 / 1000.0;
    let bound = capacity as f64 + rate * span;
    assert!(g.len() as f64 <= bound + 1.0, "{} grants over {span}s, bound {bound}", g.len());
    assert!(g.len() as f64 >= 0.9 * rate * span, "the bucket must refill: {} grants", g.len());
    assert!(Limiter::TokenBucket { capacity: 0, rate }.validate().is_err());
}
