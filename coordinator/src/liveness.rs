//! Whether the process that holds a node id is provably dead, so that a restart after a crash
//! takes the id at once instead of waiting out the member timeout.
//!
//! A holder records its process identity, `<boot id>|<pid namespace>|<start time>` (Linux:
//! `/proc/sys/kernel/random/boot_id`, the `/proc/self/ns/pid` link, field 22 of
//! `/proc/<pid>/stat`). It is provably dead when it ran on this host, in this boot and in this pid
//! namespace (so its pid means the same here), and that pid is gone or now belongs to a process
//! started at another time (a reused pid). Anything else (another host, a container with its own
//! pid namespace, no `/proc`, no recorded identity) proves nothing: the id waits for the timeout.

/// The identity of process `pid` as a holder records it; `None` where `/proc` cannot tell.
pub fn identity(pid: u32) -> Option<String> {
    let (boot, ns) = here()?;
    Some(format!("{boot}|{ns}|{}", start_time(pid)?))
}

/// This process's identity, read once (it does not change while it runs).
pub fn own_identity() -> Option<&'static str> {
    static OWN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| identity(std::process::id())).as_deref()
}

/// This process's boot id and pid namespace.
fn here() -> Option<(String, String)> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().to_owned();
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?.to_string_lossy().into_owned();
    (!boot.is_empty() && !ns.is_empty() && !boot.contains('|') && !ns.contains('|')).then_some((boot, ns))
}

/// When process `pid` started (clock ticks since boot), or `None` when there is no such process.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid … starttime is the 22nd field; comm may hold spaces and parentheses
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// Whether the holder `pid` on `host` with identity `proc` is provably dead, judged from this
/// process on `my_host`.
pub fn provably_dead(host: &str, pid: &str, proc: &str, my_host: &str) -> bool {
    let Some((boot, ns)) = here() else { return false };
    let mut theirs = proc.split('|');
    let (Some(b), Some(n), Some(started)) = (theirs.next(), theirs.next(), theirs.next()) else { return false };
    let Ok(pid) = pid.parse::<u32>() else { return false };
    if host != my_host || b != boot || n != ns || pid == std::process::id() {
        return false;
    }
    start_time(pid).is_none_or(|now| now != started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_vanished_pid_on_this_host_is_dead() {
        let me = std::process::id();
        let Some(mine) = identity(me) else { return }; // no /proc here: nothing to prove
        let host = "h";
        // ourselves, as judged by another process: alive (our pid still starts when it did)
        assert!(!provably_dead(host, &me.to_string(), &mine, "other-host"));
        // a child that exited: its pid is gone
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let theirs = identity(pid);
        child.wait().unwrap();
        if let Some(theirs) = theirs {
            assert!(provably_dead(host, &pid.to_string(), &theirs, host), "{theirs}");
        }
        // a reused pid: the same pid with another start time
        let (b, n, _) = {
            let mut p = mine.split('|');
            (p.next().unwrap().to_owned(), p.next().unwrap().to_owned(), p.next().unwrap().to_owned())
        };
        let init_like = format!("{b}|{n}|1");
        // pid 1 exists and did not start at tick 1 unless this is its very first tick: treat
        // only the clear case
        if start_time(1).is_some_and(|s| s != "1") {
            assert!(provably_dead(host, "1", &init_like, host));
        }
        // another host, another boot, another namespace, no identity: nothing proved
        assert!(!provably_dead(host, &pid.to_string(), &mine, "elsewhere"));
        assert!(!provably_dead(host, &pid.to_string(), &format!("other|{n}|1"), host));
        assert!(!provably_dead(host, &pid.to_string(), &format!("{b}|pid:[1]|1"), host));
        assert!(!provably_dead(host, &pid.to_string(), "", host));
    }
}
