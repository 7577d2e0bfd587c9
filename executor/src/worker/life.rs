//! A sign of life of a worker that writes nothing: the CPU time of its process group, what it
//! started and waits on included (read from `/proc`).

/// The CPU time of the processes of group `pgid` and of the children they reaped, in clock
/// ticks (read once per silence bound: a walk of `/proc`).
pub(super) fn group_cpu_ticks(pgid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut ticks = 0;
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // after the command's name (in parentheses, which may hold anything): the state, the
        // parent, the group; utime, stime, cutime, cstime are the 12th to 15th fields
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            ticks += fields.iter().skip(11).take(4).filter_map(|f| f.parse::<u64>().ok()).sum::<u64>();
        }
    }
    ticks
}
