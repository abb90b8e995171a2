//! A command line as Hugging Face's `HfArgumentParser` takes it, rewritten into the
//! one clap parses: `--max_steps 8` is `--max-steps 8`, and a boolean flag takes
//! `True`/`False` (`true`/`false`/`1`/`0`) after it or after `=`, as a run script
//! pasted from a `transformers` recipe writes it (`--disable_tqdm True`).
//!
//! Written here rather than as a clap alias on every field: the aliases would be a
//! second name for ~90 flags, kept in step by hand, and clap has no value form for
//! a `SetTrue` flag. The rewrite only touches a token that names a flag of the
//! command (or of the subcommand being parsed); anything else reaches clap as
//! typed, so its errors stay clap's.

use std::ffi::{OsStr, OsString};

use clap::{ArgAction, Command};

/// `argv` (the program name first) with HF's spellings rewritten for `command`.
pub fn hf_argv<I, T>(command: &Command, argv: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut tokens = argv.into_iter().map(Into::into);
    let mut out: Vec<OsString> = tokens.next().into_iter().collect();
    let mut current = command;
    let mut pending: Option<Flag> = None;
    while let Some(token) = tokens.next() {
        // After `--` everything is a value, as clap reads it.
        if out.last().is_some_and(|t| t == "--") && pending.is_none() {
            out.push(token);
            out.extend(tokens.by_ref());
            break;
        }
        if let Some(flag) = pending.take() {
            match (flag, truth(&token)) {
                (Flag::Switch, Some(true)) => continue,
                (Flag::Switch, Some(false)) => {
                    out.pop();
                    continue;
                }
                (Flag::Bool, Some(value)) => {
                    out.push(value.to_string().into());
                    continue;
                }
                _ => {}
            }
        }
        let Some(text) = token.to_str() else {
            out.push(token);
            continue;
        };
        if let Some(long) = text.strip_prefix("--").filter(|l| !l.is_empty()) {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (long, None),
            };
            if let Some((dashed, flag)) = lookup(current, name) {
                match (flag, value) {
                    (Flag::Switch, Some(v)) => match truth(OsStr::new(v)) {
                        Some(true) => out.push(format!("--{dashed}").into()),
                        Some(false) => {}
                        None => out.push(format!("--{dashed}={v}").into()),
                    },
                    (Flag::Bool, Some(v)) => {
                        let v = truth(OsStr::new(v)).map_or(v.to_string(), |b| b.to_string());
                        out.push(format!("--{dashed}={v}").into());
                    }
                    (Flag::Other, Some(v)) => out.push(format!("--{dashed}={v}").into()),
                    (flag, None) => {
                        out.push(format!("--{dashed}").into());
                        pending = matches!(flag, Flag::Switch | Flag::Bool).then_some(flag);
                    }
                }
                continue;
            }
        } else if let Some(sub) = current.find_subcommand(text) {
            current = sub;
        }
        out.push(token);
    }
    out
}

/// The process's command line parsed by `command`, HF's spellings read too (clap's
/// `Command::get_matches`, which exits on `--help` or an error).
pub fn hf_matches(command: Command) -> clap::ArgMatches {
    let argv = hf_argv(&command, std::env::args_os());
    command.get_matches_from(argv)
}

/// `T::parse()` that reads HF's spellings too: `Cli::parse_hf()`.
pub trait ParseHf: clap::Parser {
    /// The process's command line, as [`clap::Parser::parse`] (exits on `--help`
    /// or an error).
    fn parse_hf() -> Self {
        let argv = hf_argv(&Self::command(), std::env::args_os());
        Self::parse_from(argv)
    }
}

impl<T: clap::Parser> ParseHf for T {}

/// What kind of flag a name is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Flag {
    /// A bare flag (`SetTrue`): `True` after it keeps it, `False` drops it.
    Switch,
    /// A flag taking `true`/`false`: `True`/`1` become `true`, `False`/`0` `false`.
    Bool,
    /// Any other flag.
    Other,
}

/// The long flag `name` (with `_` or `-`) of `command`, dashed, and its kind.
fn lookup(command: &Command, name: &str) -> Option<(String, Flag)> {
    let dashed = name.replace('_', "-");
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(dashed.as_str()))?;
    let kind = match arg.get_action() {
        ArgAction::SetTrue => Flag::Switch,
        ArgAction::Set
            if arg.get_value_parser().type_id() == clap::builder::ValueParser::bool().type_id() =>
        {
            Flag::Bool
        }
        _ => Flag::Other,
    };
    Some((dashed, kind))
}

/// `True`/`true`/`1` and `False`/`false`/`0`, as `HfArgumentParser`'s booleans.
fn truth(token: &OsStr) -> Option<bool> {
    match token.to_str()? {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::args::TrainingArgs;
    use clap::{CommandFactory, Parser};

    fn parsed(argv: &[&str]) -> TrainingArgs {
        let argv = hf_argv(&TrainingArgs::command(), argv.iter().copied());
        TrainingArgs::try_parse_from(argv).unwrap()
    }

    #[test]
    fn hf_spellings_parse_as_the_dashed_flags() {
        let dashed = parsed(&[
            "run", "--max-steps", "8", "--per-device-train-batch-size", "4",
            "--learning-rate=3e-3", "--disable-tqdm", "--logging-first-step",
        ]);
        let hf = parsed(&[
            "run", "--max_steps", "8", "--per_device_train_batch_size", "4",
            "--learning_rate=3e-3", "--disable_tqdm", "True", "--logging_first_step=true",
            "--fp16", "False", "--bf16=0",
        ]);
        assert_eq!(serde_json::to_value(&dashed).unwrap(), serde_json::to_value(&hf).unwrap());
        assert_eq!(hf.length.max_steps, Some(8));
        assert!(hf.logging.disable_tqdm && !hf.step.fp16);
    }

    #[test]
    fn booleans_that_take_a_value_take_hf_words() {
        let args = parsed(&["run", "--dataloader_drop_last", "True", "--init_from_strict=False"]);
        assert_eq!(args.data.dataloader_drop_last, Some(true));
        assert!(!args.save.init_from_strict);
    }

    #[test]
    fn what_is_not_a_flag_reaches_clap_as_typed() {
        let command = TrainingArgs::command();
        // An unknown flag keeps its spelling, so clap's error names it.
        let argv = hf_argv(&command, ["run", "--max_stepz", "8"]);
        assert_eq!(argv, ["run", "--max_stepz", "8"].map(OsString::from));
        let err = TrainingArgs::try_parse_from(argv).unwrap_err();
        assert!(err.to_string().contains("--max_stepz"), "{err}");
        // A value that is not a truth word stays a value of the next flag's.
        let argv = hf_argv(&command, ["run", "--disable_tqdm", "--max_steps", "1"]);
        assert_eq!(argv, ["run", "--disable-tqdm", "--max-steps", "1"].map(OsString::from));
        // After `--`, nothing is rewritten.
        let argv = hf_argv(&command, ["run", "--", "--max_steps"]);
        assert_eq!(argv, ["run", "--", "--max_steps"].map(OsString::from));
    }
}
