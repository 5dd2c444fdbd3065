//! Man pages and shell completions, generated from a binary's own clap definition so
//! they never drift from it. The packages ask each binary for them at build time
//! (`ALLOT_WRITE_DOCS=DIR binary`, see `packaging/build.sh`).

use std::path::Path;

/// The environment variable that makes a binary write its docs into a directory
/// and exit.
pub const WRITE_DOCS: &str = "ALLOT_WRITE_DOCS";

/// Writes `NAME.1` (roff) and the completions `NAME.bash`, `_NAME` (zsh) and
/// `NAME.fish` for `cmd` into `dir`.
pub fn write(mut cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    use clap_complete::Shell;
    std::fs::create_dir_all(dir)?;
    let name = cmd.get_name().to_string();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    for (shell, file) in [
        (Shell::Bash, format!("{name}.bash")),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut out);
        std::fs::write(dir.join(file), out)?;
    }
    Ok(())
}

/// In `main`, first: when `$ALLOT_WRITE_DOCS` names a directory, writes `cmd`'s docs
/// there and says how the process should exit; otherwise `None`.
pub fn write_if_asked(cmd: impl FnOnce() -> clap::Command) -> Option<std::process::ExitCode> {
    let dir = std::env::var_os(WRITE_DOCS).filter(|d| !d.is_empty())?;
    Some(match write(cmd(), Path::new(&dir)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{WRITE_DOCS}: {e}");
            std::process::ExitCode::FAILURE
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_and_three_completions() {
        let dir = std::env::temp_dir().join(format!("allot-clidocs-{}", std::process::id()));
        let cmd = clap::Command::new("demo")
            .about("a demo")
            .subcommand(clap::Command::new("run").about("runs"));
        write(cmd, &dir).expect("written");
        let page = std::fs::read_to_string(dir.join("demo.1")).expect("page");
        assert!(
            page.contains(".TH demo 1") && page.contains("runs"),
            "{page}"
        );
        for f in ["demo.bash", "_demo", "demo.fish"] {
            let t = std::fs::read_to_string(dir.join(f)).expect(f);
            assert!(t.contains("run"), "{f}: {t}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
