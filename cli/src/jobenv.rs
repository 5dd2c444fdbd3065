//! What a submission carries from where it was typed, as `sbatch` does: the
//! environment (`--export ALL|NONE|VAR[,VAR…]`, then `--env KEY=VALUE`) and the
//! working directory (`--chdir`, default the current one), resolved here into the
//! final list the job gets from its submitter. allotd stores it with the workload;
//! `ALLOT_TOKEN` is never sent (it would hand the submitter's credential to the job
//! and to allotd's state file).

use allot_common::fields::{check_env, is_env_name};
use std::path::{Path, PathBuf};

/// Never exported, whatever `--export` says: the submitter's credential.
pub const NEVER: &[&str] = &["ALLOT_TOKEN"];

/// The CLI's own settings (where allotd and the agent are, the dev cluster's
/// files): not the job's, so `--export ALL` leaves them out; a list may name them.
pub const CLI_OWN: &[&str] = &[
    "ALLOT_SERVER",
    "ALLOT_CA",
    "ALLOT_SOCKET",
    "ALLOT_METRICS",
    "ALLOT_DEV_DIR",
    "ALLOT_PROJECT",
    "ALLOT_LOG",
    "ALLOT_LOG_FORMAT",
    "ALLOTD_CONFIG",
];

/// The submitted environment: `--export` picks from `vars` (the CLI's own
/// environment), then each `--env KEY=VALUE` sets or overrides one; in name order.
/// Under `ALL`, variables a job could not get back (names a shell cannot hold, such
/// as bash's exported functions, or values that are not UTF-8) are left out; a
/// variable named in a list must be set and portable. Errors name the flag and the
/// fix.
pub fn resolve(
    export: &str,
    sets: &[String],
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, String> {
    let mut env: std::collections::BTreeMap<String, String> = Default::default();
    let vars: std::collections::BTreeMap<String, String> = vars.into_iter().collect();
    match export.trim() {
        "ALL" => {
            for (k, v) in &vars {
                if is_env_name(k)
                    && !v.contains('\0')
                    && !NEVER.contains(&k.as_str())
                    && !CLI_OWN.contains(&k.as_str())
                {
                    env.insert(k.clone(), v.clone());
                }
            }
        }
        "NONE" => {}
        list => {
            for name in list.split(',').map(str::trim) {
                if !is_env_name(name) {
                    return Err(format!(
                        "--export {list}: {name:?} is not a variable name; give ALL, NONE or names separated by commas (e.g. --export PATH,HOME,WANDB_PROJECT)"
                    ));
                }
                if NEVER.contains(&name) {
                    return Err(format!(
                        "--export {list}: {name} is never sent (it is your credential for allotd); leave it out"
                    ));
                }
                let v = vars.get(name).ok_or_else(|| {
                    format!("--export {list}: {name} is not set here; set it, or give --env {name}=VALUE")
                })?;
                env.insert(name.to_string(), v.clone());
            }
        }
    }
    for s in sets {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("--env {s}: give KEY=VALUE (e.g. --env WANDB_MODE=offline)"))?;
        if !is_env_name(k) {
            return Err(format!(
                "--env {s}: {k:?} is not a variable name; use letters, digits and _, not starting with a digit"
            ));
        }
        if NEVER.contains(&k) {
            return Err(format!(
                "--env {s}: {k} is never sent (it is your credential for allotd); leave it out"
            ));
        }
        env.insert(k.to_string(), v.to_string());
    }
    let env: Vec<(String, String)> = env.into_iter().collect();
    check_env("env", env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| format!("--export {export}: {}", e.message))?;
    Ok(env)
}

/// `--chdir DIR` made absolute against `here` (the CLI's current directory), or
/// `here` itself when not given. Not resolved further: the path is looked up on
/// the hosts that run the work, which may mount it elsewhere.
pub fn workdir(chdir: Option<&Path>, here: &Path) -> PathBuf {
    match chdir {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        Some(d) => here.join(d),
        None => here.to_path_buf(),
    }
}

/// The CLI's own environment, as `resolve` takes it (values that are not UTF-8
/// are left out: the wire carries text).
pub fn own_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> Vec<(String, String)> {
        [
            ("PATH", "/opt/bin:/usr/bin"),
            ("HOME", "/home/ana"),
            ("ALLOT_TOKEN", "allot_secret"),
            ("BASH_FUNC_ml%%", "() { module ml; }"),
            ("WANDB_PROJECT", "golf"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn names(v: &[(String, String)]) -> Vec<&str> {
        v.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn all_exports_everything_but_the_token_and_what_a_job_cannot_hold() {
        let env = resolve("ALL", &[], here()).expect("resolved");
        assert_eq!(names(&env), ["HOME", "PATH", "WANDB_PROJECT"]);
    }

    #[test]
    fn the_clis_own_settings_stay_out_unless_named() {
        let mut vars = here();
        vars.push((
            "ALLOT_SOCKET".into(),
            "/tmp/dev/agents/node-1/agent.sock".into(),
        ));
        vars.push(("ALLOTD_CONFIG".into(), "/tmp/dev/allotd.toml".into()));
        let env = resolve("ALL", &[], vars.clone()).expect("resolved");
        assert_eq!(names(&env), ["HOME", "PATH", "WANDB_PROJECT"]);
        let env = resolve("ALLOT_SOCKET", &[], vars).expect("named");
        assert_eq!(names(&env), ["ALLOT_SOCKET"]);
    }

    #[test]
    fn none_and_lists_pick_and_env_overrides() {
        let env = resolve("NONE", &["A=1".into(), "B=x=y".into()], here()).expect("ok");
        assert_eq!(
            env,
            vec![
                ("A".to_string(), "1".to_string()),
                ("B".into(), "x=y".into())
            ]
        );
        let env = resolve(
            "PATH,WANDB_PROJECT",
            &["WANDB_PROJECT=swing".into()],
            here(),
        )
        .expect("ok");
        assert_eq!(
            env,
            vec![
                ("PATH".to_string(), "/opt/bin:/usr/bin".to_string()),
                ("WANDB_PROJECT".into(), "swing".into())
            ]
        );
    }

    #[test]
    fn refusals_name_the_flag_and_the_fix() {
        let e = resolve("PATH,NOPE", &[], here()).expect_err("unset");
        assert!(
            e.starts_with("--export PATH,NOPE: NOPE is not set") && e.contains("--env NOPE=VALUE"),
            "{e}"
        );
        let e = resolve("ALLOT_TOKEN", &[], here()).expect_err("token");
        assert!(e.contains("never sent"), "{e}");
        let e = resolve("ALL", &["ALLOT_TOKEN=x".into()], here()).expect_err("token");
        assert!(
            e.starts_with("--env ALLOT_TOKEN=x: ") && e.contains("never sent"),
            "{e}"
        );
        let e = resolve("ALL", &["NOEQUALS".into()], here()).expect_err("no =");
        assert!(e.contains("KEY=VALUE"), "{e}");
        let e = resolve("ALL", &["1X=2".into()], here()).expect_err("bad name");
        assert!(e.contains("not a variable name"), "{e}");
        let big = vec![("BIG".to_string(), "x".repeat(70_000))];
        let e = resolve("ALL", &[], big).expect_err("too big");
        assert!(
            e.starts_with("--export ALL: ") && e.contains("--export NONE"),
            "{e}"
        );
    }

    #[test]
    fn the_working_directory_is_absolute() {
        let here = Path::new("/home/ana/golf");
        assert_eq!(workdir(None, here), here);
        assert_eq!(
            workdir(Some(Path::new("runs/1")), here),
            here.join("runs/1")
        );
        assert_eq!(
            workdir(Some(Path::new("/scratch")), here),
            Path::new("/scratch")
        );
    }
}
