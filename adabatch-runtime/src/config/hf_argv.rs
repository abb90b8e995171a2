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
//!
//! An arguments file (`prog args.json`, as `HfArgumentParser.parse_json_file`
//! reads one) is the first argument of a command that takes no positional
//! argument: its keys become flags placed before the command line's, those the
//! command line gives left out (flags win). HF's own dump
//! (`TrainingArguments.to_json_string()`) loads: a key adabatch has no flag for is
//! accepted at HF's default and refused at any other value, naming it
//! (`hf_training_args.json`: the defaults of transformers 4.46.3 and 4.57.6), and
//! a key neither knows is an error naming it.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::{ArgAction, Command};
use serde_json::Value;

use crate::error::{Error, FileOp, Result, SettingsError};

/// HF `TrainingArguments` keys adabatch has no flag for, with the values accepted
/// (HF's defaults); `null`: any value (one HF derives from others, as `run_name`).
const HF_ONLY: &str = include_str!("hf_training_args.json");

/// `argv` (the program name first) with HF's spellings rewritten for `command`,
/// and an arguments file's settings merged under the flags. A file that cannot be
/// read, or holds a setting the run cannot take, is an error naming it.
pub fn hf_argv<I, T>(command: &Command, argv: I) -> Result<Vec<OsString>>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let file = arguments_file(command, &argv);
    if file.is_some() {
        argv.remove(1);
    }
    let mut out = rewrite(command, argv);
    if let Some(path) = file {
        let given: HashSet<String> = out
            .iter()
            .filter_map(|t| t.to_str()?.strip_prefix("--"))
            .map(|flag| flag.split('=').next().unwrap_or(flag).to_string())
            .collect();
        let settings = file_flags(command, &path, &given)?;
        // After the program's name (a file implies one: it is the argument after it).
        out.splice(1..1, settings);
    }
    Ok(out)
}

/// The arguments file: the first argument, a `.json` path, of a command that
/// takes no positional argument and has no subcommand.
fn arguments_file(command: &Command, argv: &[OsString]) -> Option<PathBuf> {
    let first = argv.get(1)?.to_str()?;
    let takes_none = command.get_positionals().next().is_none() && !command.has_subcommands();
    (takes_none && first.ends_with(".json") && !first.starts_with('-')).then(|| first.into())
}

/// The file's settings as flags of `command`, but for those in `given`.
fn file_flags(command: &Command, path: &Path, given: &HashSet<String>) -> Result<Vec<OsString>> {
    let bad = |detail: String| {
        Error::Settings(SettingsError::ArgumentsFile {
            path: path.to_path_buf(),
            detail,
        })
    };
    let text = std::fs::read_to_string(path).map_err(Error::io(FileOp::Read, path))?;
    let settings: serde_json::Map<String, Value> = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a JSON object of settings: {e}")))?;
    let hf_only: BTreeMap<String, Option<Vec<Value>>> =
        serde_json::from_str(HF_ONLY).expect("the table of HF's defaults parses");
    let mut flags = Vec::new();
    for (key, value) in &settings {
        if let Some((dashed, flag)) = lookup(command, key) {
            if !given.contains(&dashed) {
                flags.extend(file_value(&dashed, flag, key, value).map_err(bad)?);
            }
            continue;
        }
        match hf_only.get(key) {
            Some(None) => {}
            Some(Some(defaults)) if defaults.contains(value) => {}
            Some(Some(defaults)) => {
                let accepted: Vec<String> = defaults.iter().map(Value::to_string).collect();
                return Err(bad(format!(
                    "`{key}` = {value}: a setting of Hugging Face's TrainingArguments that adabatch does not act on, accepted only at HF's default ({})",
                    accepted.join(" or ")
                )));
            }
            None => {
                return Err(bad(format!(
                    "`{key}`: neither a flag of this program nor a setting of Hugging Face's TrainingArguments (`--help` lists the flags)"
                )))
            }
        }
    }
    Ok(flags)
}

/// A file's `key = value` as the flag `--dashed` would take it (none for `null`,
/// `false` of a bare flag, an empty list, or HF's `max_steps = -1`, "unset").
fn file_value(
    dashed: &str,
    flag: Flag,
    key: &str,
    value: &Value,
) -> std::result::Result<Vec<OsString>, String> {
    let with = |text: String| vec![OsString::from(format!("--{dashed}={text}"))];
    Ok(match (flag, value) {
        (_, Value::Null) => Vec::new(),
        (Flag::Switch, Value::Bool(true)) => vec![format!("--{dashed}").into()],
        (Flag::Switch, Value::Bool(false)) => Vec::new(),
        (Flag::Switch, other) => return Err(format!("`{key}` = {other}: expected true or false")),
        (_, Value::Bool(b)) => with(b.to_string()),
        (_, Value::Number(n)) if key == "max_steps" && n.as_i64() == Some(-1) => Vec::new(),
        (_, Value::Number(n)) => with(number(n)),
        (_, Value::String(s)) => with(s.clone()),
        (_, Value::Array(items)) if items.is_empty() => Vec::new(),
        (_, Value::Array(items)) => {
            let texts: Option<Vec<String>> =
                items.iter().map(|v| v.as_str().map(String::from)).collect();
            let texts =
                texts.ok_or_else(|| format!("`{key}` = {value}: expected a list of names"))?;
            with(texts.join(","))
        }
        (_, Value::Object(_)) => {
            return Err(format!(
                "`{key}` = {value}: expected a value, not an object"
            ))
        }
    })
}

/// A JSON number as a flag's text: a whole float without its `.0` (HF writes
/// `num_train_epochs` as `3.0`, which adabatch counts in whole epochs).
fn number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => n.to_string(),
    }
}

/// `argv` with HF's spellings and boolean values rewritten for `command`.
fn rewrite(command: &Command, argv: Vec<OsString>) -> Vec<OsString> {
    let mut tokens = argv.into_iter();
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
    let argv = hf_argv(&command, std::env::args_os()).unwrap_or_else(|e| exit_on(e));
    command.get_matches_from(argv)
}

/// An arguments file's error: `error: …` and exit 1, as [`crate::exit_code`].
fn exit_on(error: Error) -> ! {
    eprintln!("{}", error.report());
    std::process::exit(1)
}

/// `T::parse()` that reads HF's spellings too: `Cli::parse_hf()`.
pub trait ParseHf: clap::Parser {
    /// The process's command line, as [`clap::Parser::parse`] (exits on `--help`
    /// or an error).
    fn parse_hf() -> Self {
        let argv = hf_argv(&Self::command(), std::env::args_os()).unwrap_or_else(|e| exit_on(e));
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
        let argv = hf_argv(&TrainingArgs::command(), argv.iter().copied()).unwrap();
        TrainingArgs::try_parse_from(argv).unwrap()
    }

    #[test]
    fn hf_spellings_parse_as_the_dashed_flags() {
        let dashed = parsed(&[
            "run",
            "--max-steps",
            "8",
            "--per-device-train-batch-size",
            "4",
            "--learning-rate=3e-3",
            "--disable-tqdm",
            "--logging-first-step",
        ]);
        let hf = parsed(&[
            "run",
            "--max_steps",
            "8",
            "--per_device_train_batch_size",
            "4",
            "--learning_rate=3e-3",
            "--disable_tqdm",
            "True",
            "--logging_first_step=true",
            "--fp16",
            "False",
            "--bf16=0",
        ]);
        assert_eq!(
            serde_json::to_value(&dashed).unwrap(),
            serde_json::to_value(&hf).unwrap()
        );
        assert_eq!(hf.length.max_steps, Some(8));
        assert!(hf.logging.disable_tqdm && !hf.step.fp16);
    }

    #[test]
    fn booleans_that_take_a_value_take_hf_words() {
        let args = parsed(&[
            "run",
            "--dataloader_drop_last",
            "True",
            "--init_from_strict=False",
        ]);
        assert_eq!(args.data.dataloader_drop_last, Some(true));
        assert!(!args.save.init_from_strict);
    }

    #[test]
    fn what_is_not_a_flag_reaches_clap_as_typed() {
        let command = TrainingArgs::command();
        // An unknown flag keeps its spelling, so clap's error names it.
        let argv = hf_argv(&command, ["run", "--max_stepz", "8"]).unwrap();
        assert_eq!(argv, ["run", "--max_stepz", "8"].map(OsString::from));
        let err = TrainingArgs::try_parse_from(argv).unwrap_err();
        assert!(err.to_string().contains("--max_stepz"), "{err}");
        // A value that is not a truth word stays a value of the next flag's.
        let argv = hf_argv(&command, ["run", "--disable_tqdm", "--max_steps", "1"]).unwrap();
        assert_eq!(
            argv,
            ["run", "--disable-tqdm", "--max-steps", "1"].map(OsString::from)
        );
        // After `--`, nothing is rewritten.
        let argv = hf_argv(&command, ["run", "--", "--max_steps"]).unwrap();
        assert_eq!(argv, ["run", "--", "--max_steps"].map(OsString::from));
    }
}
