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
    let msg = e.message().trim();
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
        return ScenarioError::Parse(shown(msg).into_owned());
    }
    ScenarioError::Invalid {
        key: shown(&key).into_owned(),
        problem: shown(msg).into_owned(),
    }
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
pub(crate) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
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
