//! The scenario as TOML text: `--set` overrides applied to its tree, and
//! typed-deserialization errors named by the dotted key they concern.

use super::ScenarioError;

/// Short keys accepted by `--set` for the common knobs.
fn alias(key: &str) -> &str {
    match key {
        "rate_pps" => "workload.udp.rate_pps",
        "iterations" => "workload.whileloop.iterations",
        "interval_us" => "workload.cyclictest.interval_us",
        "itr" => "nic.itr",
        "msg_bytes" => "workload.netpipe.msg_bytes",
        "rate_rps" => "workload.memcached.rate_rps",
        k => k,
    }
}

/// Parses `text` as a TOML scalar (number, bool, string) or takes it as a
/// bare string.
fn scalar(text: &str) -> toml::Value {
    let doc = format!("v = {text}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(text.into())),
        Err(_) => toml::Value::String(text.into()),
    }
}

/// A typed-deserialization error of the scenario `text` (as written back
/// from its tree, overrides applied), named by the dotted key at its
/// position: `[section]` headers above the line give the table, the
/// line its key; an error on a header is the table's own.
pub(super) fn typed_error(text: &str, e: &toml::de::Error) -> ScenarioError {
    let Some(span) = e.span().filter(|s| s.start <= text.len()) else {
        return ScenarioError::Parse(shown(e.message()).into_owned());
    };
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    // How many `[[a]]` headers stand in the text up to `upto`: `a`'s
    // element there is the last of them.
    let elements = |a: &str, upto: usize| {
        let marker = format!("[[{a}]]");
        text[..upto].lines().filter(|x| x.trim() == marker).count()
    };
    // `[[a]]` → a[i], its i-th element up to `upto`; `[a.b]` → a.b, or
    // a[i].b where `[[a]]` came before (a table of a's latest element).
    let header = |l: &str, upto: usize| {
        let l = l.trim();
        if let Some(h) = l.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let h = h.trim();
            return Some(format!("{h}[{}]", elements(h, upto).saturating_sub(1)));
        }
        let h = l.strip_prefix('[')?.strip_suffix(']')?.trim();
        let parts: Vec<&str> = h.split('.').collect();
        for n in (1..parts.len()).rev() {
            let array = parts[..n].join(".");
            let i = elements(&array, upto);
            if i > 0 {
                return Some(format!("{array}[{}].{}", i - 1, parts[n..].join(".")));
            }
        }
        Some(h.to_string())
    };
    let here = header(line, line_start + line.len());
    // The last header above the line.
    let section = || {
        let mut sec = None;
        let mut end = 0;
        for l in text[..line_start].split_inclusive('\n') {
            end += l.len();
            if let Some(h) = header(l, end) {
                sec = Some(h);
            }
        }
        sec
    };
    let join = |sec: Option<String>, leaf: &str| super::key(&sec.unwrap_or_default(), leaf);
    let msg = &with_suggestion(e.message().trim());
    let msg = msg.as_str();
    let key = if let Some(field) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        // The span is the table that lacks the field.
        join(here, field)
    } else if let Some(h) = here {
        h
    } else {
        join(section(), line.split('=').next().unwrap_or("").trim())
    };
    if key.is_empty() {
        return ScenarioError::Parse(elide_quoted(msg).into_owned());
    }
    // The whole message, only the user's own text in it shortened: the
    // list of valid names after it is what the user needs.
    ScenarioError::Invalid {
        key: shown(&key).into_owned(),
        problem: elide_quoted(msg).into_owned(),
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown
/// variant"), with "did you mean `a`?" added for a near miss: the valid
/// name at the smallest edit distance, if it is at most a third of the
/// name's length (and at least 1).
pub(crate) fn with_suggestion(msg: &str) -> String {
    let given = ["unknown field `", "unknown variant `"]
        .iter()
        .find_map(|p| msg.strip_prefix(p))
        .and_then(|r| r.split('`').next());
    let (Some(given), Some((_, expected))) = (given, msg.split_once("expected")) else {
        return msg.to_string();
    };
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|c| (edit_distance(given, c), c))
        .min();
    match best {
        Some((d, c)) if d > 0 && d <= (given.chars().count() / 3).max(1) => {
            format!("{msg}; did you mean `{c}`?")
        }
        _ => msg.to_string(),
    }
}

/// Levenshtein distance between `a` and `b`, by characters (a name longer
/// than a key could be is not compared: its distance is its length).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len() > 256 || b.len() > 256 {
        return a.len().max(b.len());
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != cb)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    row[b.len()]
}

/// The deepest key a scenario has is five parts (`vm.2.workload.udp.
/// rate_pps`); a deeper `--set` key cannot name anything, and building
/// its nested tables unbounded (a 30,000-part key) overflowed the stack
/// when the tree was serialized.
const MAX_KEY_PARTS: usize = 16;

/// Longest user text an error message repeats in full.
const MAX_ECHO: usize = 120;

/// `text` as an error message shows it: in full when short, else its
/// start, its length and its end (an error must not echo a 100 KB value
/// back, and the end of a message says what was expected).
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_ECHO {
        return text.into();
    }
    let mut head = MAX_ECHO * 2 / 3;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - MAX_ECHO / 3;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}…[{} bytes in all]…{}",
        &text[..head],
        text.len(),
        &text[tail..]
    )
    .into()
}

/// `msg` with every quoted span (between backticks or double quotes)
/// longer than an error should echo shortened by [`shown`]: the user's
/// value is cut, the message around it (what was expected, the known
/// names) is kept.
pub(crate) fn elide_quoted(msg: &str) -> std::borrow::Cow<'_, str> {
    if msg.len() <= MAX_ECHO {
        return msg.into();
    }
    let mut out = msg.to_string();
    for q in ['`', '"'] {
        out = out
            .split(q)
            .enumerate()
            .map(|(i, part)| if i % 2 == 1 { shown(part) } else { part.into() })
            .collect::<Vec<_>>()
            .join(&q.to_string());
    }
    out.into()
}

/// Applies one `key=value` override to a TOML tree.
pub fn apply_set(tree: &mut toml::Table, kv: &str) -> Result<(), ScenarioError> {
    let text = kv;
    // Messages below quote the override as `kv`, shortened.
    let shown_kv = shown(text);
    let kv = shown_kv.as_ref();
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| ScenarioError::Set(format!("`{kv}`: expected key=value")))?;
    let key = alias(k.trim());
    if key.is_empty() {
        return Err(ScenarioError::Set(format!("`{kv}`: empty key")));
    }
    let parts: Vec<&str> = key.split('.').collect();
    if parts.len() > MAX_KEY_PARTS {
        return Err(ScenarioError::Set(format!(
            "`{kv}`: a key of {} parts; no scenario key has more than {MAX_KEY_PARTS}",
            parts.len()
        )));
    }
    // A workload key needs the workload: `--set` tunes a workload the
    // scenario runs, it does not add one. A table given with all its
    // defaults (`[workload.sip]` alone) is a workload too.
    let workload_given = tree
        .get("workload")
        .and_then(|w| w.as_table())
        .is_some_and(|w| parts.get(1).is_some_and(|n| w.contains_key(*n)));
    let mut t = tree;
    let mut i = 0;
    while i + 1 < parts.len() {
        let p = parts[i];
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        // `vm.2.copies`: a number after an array of tables indexes it.
        // With no such array (a single-VM scenario has no `[[vm]]`) it
        // would make a table keyed "2", refused later as a wrong type.
        if !entry.is_array() && i + 2 < parts.len() && parts[i + 1].parse::<usize>().is_ok() {
            let name = parts[..=i].join(".");
            let hint = if name == "vm" {
                " (without them the scenario is one VM: write it as a `[[vm]]` table to set its keys)"
            } else {
                ""
            };
            return Err(ScenarioError::Set(format!(
                "`{kv}`: the scenario has no `[[{name}]]` tables to index{hint}"
            )));
        }
        let entry = if entry.is_array() && i + 2 < parts.len() {
            let toml::Value::Array(a) = entry else {
                unreachable!("checked just above")
            };
            {
                let n: usize = parts[i + 1].parse().map_err(|_| {
                    ScenarioError::Set(format!(
                        "`{kv}`: `{}` is an array: give an index after it",
                        parts[..=i].join(".")
                    ))
                })?;
                let len = a.len();
                i += 1;
                a.get_mut(n).ok_or_else(|| {
                    ScenarioError::Set(format!(
                        "`{kv}`: `{}` has {len} entries",
                        parts[..i].join(".")
                    ))
                })?
            }
        } else {
            entry
        };
        t = entry.as_table_mut().ok_or_else(|| {
            ScenarioError::Set(format!(
                "`{kv}`: `{}` is not a table",
                parts[..=i].join(".")
            ))
        })?;
        i += 1;
    }
    if key.starts_with("workload.") && parts.len() == 3 && !workload_given {
        return Err(ScenarioError::Set(format!(
            "`{}`: this scenario has no `{}` workload",
            shown(k),
            shown(parts[1])
        )));
    }
    t.insert(parts[parts.len() - 1].to_string(), scalar(v.trim()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_miss_gets_a_suggestion_and_a_far_one_does_not() {
        let m = "unknown field `rate_ps`, expected one of `rate_pps`, `burst`";
        assert!(with_suggestion(m).ends_with("did you mean `rate_pps`?"));
        let m = "unknown field `zzz`, expected one of `rate_pps`, `burst`";
        assert_eq!(with_suggestion(m), m);
        let m = "unknown variant `kvm2026`, expected one of `kvm`, `kvm-2026`";
        assert!(with_suggestion(m).ends_with("did you mean `kvm-2026`?"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn an_unknown_key_error_lists_every_valid_key() {
        let text = "scheme = \"kvm\"\nduration_s = 0.01\n[workload.udp]\nrate_pps = 1000\n[nic]\nitr_intervall_us = 5\n";
        let e = crate::scenario::Scenario::parse(text, &[])
            .unwrap_err()
            .to_string();
        assert!(!e.contains("bytes in all"), "{e}");
        assert!(e.contains("did you mean `itr_interval_us`?"), "{e}");
        // The last of the valid names is there, not cut off.
        let names = e.split("expected").nth(1).unwrap_or("");
        assert!(names.matches('`').count() >= 6, "{e}");
    }
}
