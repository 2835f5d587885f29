// SPDX-License-Identifier: MIT OR Apache-2.0
//! Test only: the subset of JSON Schema draft-07 that CDI's schema uses (`type`, `properties`,
//! `required`, `items`, `$ref` to `#/definitions/...` and `defs.json#/definitions/...`,
//! `minimum`, `maximum`, `patternProperties` with the pattern `.{1,}`), to validate `udmactl
//! cdi`'s output offline (no schema crate is available to the build). Any other keyword that
//! constrains is refused, so a newer schema fails the test loudly rather than pass unchecked.

use serde_json::Value;

/// Keywords that only describe.
const IGNORED: &[&str] = &["description", "$schema", "definitions", "ref"];

/// Validates `v` against `schema` (a node of `root`, the document `#` refers to; `defs` is
/// defs.json), appending "path: problem" lines to `errors`.
pub fn validate(v: &Value, schema: &Value, root: &Value, defs: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        errors.push(format!("{path}: schema node is not an object"));
        return;
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let (doc, frag) = match r.split_once('#') {
            Some(("", frag)) => (root, frag),
            Some(("defs.json", frag)) => (defs, frag),
            _ => return errors.push(format!("{path}: unsupported $ref {r}")),
        };
        match doc.pointer(frag) {
            // A `#` inside defs.json refers to defs.json.
            Some(target) => validate(v, target, doc, defs, path, errors),
            None => errors.push(format!("{path}: $ref {r} not found")),
        }
        return;
    }
    for (key, rule) in obj {
        match key.as_str() {
            "type" => {
                let want = rule.as_str().unwrap_or("");
                let ok = match want {
                    "object" => v.is_object(),
                    "array" => v.is_array(),
                    "string" => v.is_string(),
                    "integer" => v.is_i64() || v.is_u64(),
                    "number" => v.is_number(),
                    "boolean" => v.is_boolean(),
                    _ => false,
                };
                if !ok {
                    errors.push(format!("{path}: not of type {want}: {v}"));
                }
            }
            "properties" => {
                if let (Some(props), Some(o)) = (rule.as_object(), v.as_object()) {
                    for (k, sub) in props {
                        if let Some(x) = o.get(k) {
                            validate(x, sub, root, defs, &format!("{path}.{k}"), errors);
                        }
                    }
                }
            }
            "required" => {
                if let (Some(req), Some(o)) = (rule.as_array(), v.as_object()) {
                    for k in req.iter().filter_map(Value::as_str) {
                        if !o.contains_key(k) {
                            errors.push(format!("{path}: missing {k}"));
                        }
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, x) in a.iter().enumerate() {
                        validate(x, rule, root, defs, &format!("{path}[{i}]"), errors);
                    }
                }
            }
            "minimum" | "maximum" => {
                if let (Some(bound), Some(x)) = (rule.as_f64(), v.as_f64()) {
                    if (key == "minimum" && x < bound) || (key == "maximum" && x > bound) {
                        errors.push(format!("{path}: {x} beyond {key} {bound}"));
                    }
                }
            }
            "patternProperties" => {
                let Some(pats) = rule.as_object() else { continue };
                for (pat, sub) in pats {
                    if pat != ".{1,}" {
                        errors.push(format!("{path}: unsupported pattern {pat}"));
                        continue;
                    }
                    for (k, x) in v.as_object().into_iter().flatten().filter(|(k, _)| !k.is_empty()) {
                        validate(x, sub, root, defs, &format!("{path}.{k}"), errors);
                    }
                }
            }
            k if IGNORED.contains(&k) => {}
            k => errors.push(format!("{path}: unsupported keyword {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_keyword_rejects_what_it_should() {
        let root = json!({"definitions": {"u8": {"type": "integer", "minimum": 0, "maximum": 255}}});
        let schema = json!({
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"$ref": "#/definitions/u8"}}},
        });
        let check = |v: Value| {
            let mut e = Vec::new();
            validate(&v, &schema, &root, &json!({}), "$", &mut e);
            e
        };
        assert!(check(json!({"a": [0, 255]})).is_empty());
        assert_eq!(check(json!({})).len(), 1);
        assert_eq!(check(json!({"a": [256]})).len(), 1);
        assert_eq!(check(json!({"a": ["x"]})).len(), 1);
        assert_eq!(check(json!([])).len(), 1);
        let mut e = Vec::new();
        validate(&json!(1), &json!({"enum": [1]}), &root, &json!({}), "$", &mut e);
        assert_eq!(e.len(), 1, "an unknown keyword passed");
    }
}
