//! Writing stdout so that a closed pipe ends the program quietly (the `out!`/`outln!` macros).

use super::exit;

/// Writes to stdout (and a newline when `line`). `shardctl status | head -1`: when the reader
/// went away (the write fails with `BrokenPipe`), that is no error of ours, so end quietly with
/// 0 as a filter would; any other failure to write stdout (a full disk) exits 1 with a message.
/// Rust ignores SIGPIPE, and turning it back on would take `unsafe` code.
pub fn write_stdout(args: std::fmt::Arguments<'_>, line: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| if line { out.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = written.and_then(|()| if line { Ok(()) } else { out.flush() }) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(exit::ERROR.into());
    }
}
