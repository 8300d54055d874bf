//! Every scenario key with its type, default and documentation, read from
//! the scenario structs themselves (their `schemars::JsonSchema` derive:
//! the field's doc comment, its serde name, default and type), so the
//! list cannot drift from the code (`exitless keys`).

use serde_json::Value;

/// One scenario key.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Key {
    /// Dotted path as `--set` takes it; `[]` marks an array of tables
    /// (`preemptions[].at_ms`: each `[[preemptions]]` entry's `at_ms`).
    pub key: String,
    /// TOML type: `float`, `integer`, `bool`, `string`, a choice of
    /// strings (`"vf" | "virtio"`), or `array of ...`.
    pub ty: String,
    /// The default as TOML text; `None`: required (where its table is
    /// given) or no default.
    pub default: Option<String>,
    /// Whether the key must be given when its table is.
    pub required: bool,
    /// The field's doc comment.
    pub doc: String,
}

/// The scenario's JSON schema (schemars).
pub fn schema() -> Value {
    schemars::schema_for!(crate::scenario::Scenario).to_value()
}

fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or("");
            root.get("$defs")
                .and_then(|d| d.get(name))
                .map(|d| resolve(root, d))
                .unwrap_or(s)
        }
        None => s,
    }
}

/// The non-null alternative of `Option<T>` (`anyOf: [T, null]` or
/// `type: [t, "null"]`), and whether there was a null.
fn strip_null<'a>(root: &'a Value, s: &'a Value) -> (Value, bool) {
    if let Some(alts) = s.get("anyOf").and_then(|a| a.as_array()) {
        let non: Vec<&Value> = alts
            .iter()
            .filter(|a| a.get("type").and_then(|t| t.as_str()) != Some("null"))
            .collect();
        if non.len() == 1 && non.len() < alts.len() {
            return (resolve(root, non[0]).clone(), true);
        }
    }
    let s = resolve(root, s);
    if let Some(ts) = s.get("type").and_then(|t| t.as_array()) {
        let non: Vec<&Value> = ts.iter().filter(|t| t.as_str() != Some("null")).collect();
        if non.len() == 1 && non.len() < ts.len() {
            let mut c = s.clone();
            c["type"] = non[0].clone();
            return (c, true);
        }
    }
    (s.clone(), false)
}

fn type_name(root: &Value, s: &Value) -> String {
    let (s, _) = strip_null(root, s);
    let consts = |alts: &Value| -> Option<Vec<String>> {
        alts.as_array()?
            .iter()
            .map(|a| {
                let a = resolve(root, a);
                a.get("const")
                    .or_else(|| a.get("enum").and_then(|e| e.get(0)))
                    .map(|c| c.to_string())
            })
            .collect()
    };
    if let Some(e) = s.get("enum").and_then(|e| e.as_array()) {
        return e
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" | ");
    }
    if let Some(c) = s.get("oneOf").and_then(consts) {
        return c.join(" | ");
    }
    match s.get("type").and_then(|t| t.as_str()) {
        Some("number") => "float".into(),
        Some("integer") => "integer".into(),
        Some("boolean") => "bool".into(),
        Some("string") => "string".into(),
        Some("array") => match s.get("items") {
            Some(i) => format!("array of {}", type_name(root, i)),
            None => "array".into(),
        },
        Some("object") => "table".into(),
        _ => "value".into(),
    }
}

fn is_table(s: &Value) -> bool {
    s.get("properties").is_some()
}

/// TOML text of a JSON default.
fn toml_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(toml::Value::String(s.clone()).to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(a) if a.is_empty() => Some("[]".into()),
        Value::Object(o) if o.is_empty() => Some("{}".into()),
        v => Some(v.to_string()),
    }
}

fn walk(root: &Value, table: &Value, prefix: &str, defaults: Option<&Value>, out: &mut Vec<Key>) {
    let Some(props) = table.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    let required: Vec<&str> = table
        .get("required")
        .and_then(|r| r.as_array())
        .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    for (name, prop) in props {
        let key = format!("{prefix}{name}");
        let default = prop
            .get("default")
            .or_else(|| defaults.and_then(|d| d.get(name)));
        let (inner, _) = strip_null(root, prop);
        if is_table(&inner) {
            walk(root, &inner, &format!("{key}."), default, out);
            continue;
        }
        if inner.get("type").and_then(|t| t.as_str()) == Some("array") {
            if let Some(items) = inner.get("items") {
                let items = resolve(root, items);
                if is_table(items) {
                    walk(root, items, &format!("{key}[]."), None, out);
                    continue;
                }
            }
        }
        out.push(Key {
            key,
            ty: type_name(root, prop),
            default: default.and_then(toml_text),
            required: required.contains(&name.as_str()),
            doc: prop
                .get("description")
                .and_then(|d| d.as_str())
                .unwrap_or("")
                .to_string(),
        });
    }
}

/// Every scenario key (tables flattened into dotted keys), in the
/// schema's order (alphabetical within a table).
pub fn keys() -> Vec<Key> {
    let root = schema();
    let mut out = Vec::new();
    walk(&root, &root, "", None, &mut out);
    out
}

/// `exitless keys`' text: key, type and default on one line, the doc
/// indented below.
pub fn to_text(keys: &[Key]) -> String {
    let mut o = String::new();
    for k in keys {
        let d = match (&k.default, k.required) {
            (_, true) => "required".to_string(),
            (Some(d), false) => format!("default {d}"),
            (None, false) => "optional".to_string(),
        };
        o.push_str(&format!("{:<44} {:<28} {d}\n", k.key, k.ty));
        for l in k.doc.lines() {
            o.push_str(&format!("    {}\n", l.trim()));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_key_is_documented() {
        let ks = keys();
        let undocumented: Vec<&str> = ks
            .iter()
            .filter(|k| k.doc.trim().is_empty())
            .map(|k| k.key.as_str())
            .collect();
        assert!(
            undocumented.is_empty(),
            "scenario keys without a doc comment: {undocumented:?}"
        );
    }

    #[test]
    fn keys_types_and_defaults_come_from_the_structs() {
        let ks = keys();
        let get = |name: &str| {
            ks.iter().find(|k| k.key == name).unwrap_or_else(|| {
                panic!(
                    "no key {name} in {:?}",
                    ks.iter().map(|k| &k.key).collect::<Vec<_>>()
                )
            })
        };
        let d = crate::scenario::GuestSpec::default();
        assert_eq!(
            get("guest.hz").default.as_deref(),
            Some(d.hz.to_string().as_str())
        );
        assert_eq!(get("guest.hz").ty, "integer");
        assert_eq!(get("duration_s").ty, "float");
        assert!(get("duration_s").required);
        assert_eq!(get("machine.cores").default.as_deref(), Some("2"));
        assert!(get("guest.tick").ty.contains("\"nohz-idle\""));
        assert_eq!(
            get("net.device").ty,
            "\"vf\" | \"virtio\" | \"virtio-vsock\" | \"spi-nic\""
        );
        assert!(get("workload.udp.rate_pps").required);
        assert_eq!(
            get("workload.udp.payload_bytes").default.as_deref(),
            Some("128")
        );
        assert!(get("preemptions[].at_ms").required);
        assert!(!get("vm[].core").required, "core or cores");
        assert_eq!(get("vm[].vcpus").default.as_deref(), Some("1"));
        assert!(get("host.burners[].cores")
            .ty
            .starts_with("array of integer"));
        assert!(get("hv.eli_critical").ty.contains("\"nmi\""));
        // Not a key: skipped by serde, so absent here too.
        assert!(ks.iter().all(|k| !k.key.starts_with("warnings")));
        // Every key parses back through --set-style paths: each dotted
        // top-level section exists in the schema.
        let text = to_text(&ks);
        assert!(text.contains("workload.memcached.rate_rps"));
    }
}
