//! Messages for names that are not in a list: "did you mean `x`?", "expected one of
//! `a`, `b`", and the names users bring from Hugging Face / PyTorch.

/// Names users bring from Hugging Face / PyTorch, with where they belong here.
const KNOWN_ELSEWHERE: &[(&str, &str)] = &[
    ("dataloader_drop_last", "the key is `drop_last = true|false`"),
    ("gradient_accumulation_steps", "the key is `grad_accum = fixed(n)`"),
    ("auto_find_batch_size", "write `oom = halve`"),
    ("batch_size", "the initial size is a run-time setting: `TrainingArgs::per_device_train_batch_size`; the attribute takes `schedule`, `min_batch`, `max_batch`"),
    ("per_device_train_batch_size", "this is a run-time setting: set it in `TrainingArgs`"),
    ("num_train_epochs", "this is a run-time setting: set it in `TrainingArgs`"),
    ("epochs", "this is a run-time setting: `TrainingArgs::num_train_epochs`"),
    ("learning_rate", "this is a run-time setting: set it in `TrainingArgs`; the attribute takes `lr_scaling`"),
    ("lr", "this is a run-time setting: `TrainingArgs::learning_rate`; the attribute takes `lr_scaling`"),
    ("max_steps", "this is a run-time setting: set it in `TrainingArgs`"),
];

/// "expected one of `a`, `b`, `c`"
pub fn one_of(choices: &[&str]) -> String {
    let list: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    format!("expected one of {}", list.join(", "))
}

/// "unknown {what} `{name}`: did you mean `x`? (expected one of ...)"
pub fn unknown(what: &str, name: &str, choices: &[&str]) -> String {
    unknown_of(what, name, "", choices)
}

/// "unknown {what} `{name}`{of}: did you mean `x`? (expected one of ...)"; a key
/// known from elsewhere gets its hint instead of a suggestion.
pub fn unknown_of(what: &str, name: &str, of: &str, choices: &[&str]) -> String {
    let head = format!("unknown {what} `{name}`{of}");
    let elsewhere = KNOWN_ELSEWHERE
        .iter()
        .find(|(k, _)| *k == name && what == "key");
    if let Some((_, hint)) = elsewhere {
        format!("{head}: {hint}; {}", one_of(choices))
    } else if let Some(best) = did_you_mean(name, choices) {
        format!("{head}: did you mean `{best}`? ({})", one_of(choices))
    } else {
        format!("{head}; {}", one_of(choices))
    }
}

/// The closest choice, if it is close enough to be a typo.
pub fn did_you_mean<'a>(name: &str, choices: &[&'a str]) -> Option<&'a str> {
    let lower = name.to_lowercase();
    choices
        .iter()
        .map(|c| (osa_distance(&lower, c), *c))
        .filter(|(d, c)| *d <= (c.len().max(lower.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions.
pub fn osa_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}
