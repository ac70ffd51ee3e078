//! Every error of a scenario file in one run, not one per run: "knock-out recovery".
//!
//! Validation stops at its first error, and a user fixing a file with three mistakes would
//! otherwise run stepsim three times. After a failure (never on the success path) the field
//! the error names is removed from the file's TOML table, as if the user had not written it
//! (its default, or "is required", applies), and the table is validated again; the next error
//! is collected, and so on. Recovery stops when validation passes, when an error names no
//! field the table holds (a whole-file error, a missing field, a cross-field error about a
//! field not written), or at [`MAX_ERRORS`]; that last error is still reported.
//!
//! Honesty: an error the knock-out may itself have caused is not reported, and recovery stops
//! there, since what follows would be about a file the user did not write: one that names a
//! removed field (or a table above or below it: "`model.hidden` is required" after removing
//! `model.hidden`), whose message mentions one (`parallel.tensor` in a cross-field check,
//! or `framework = ...` after `parallel.framework` was removed), or that names a field not
//! written beside a removed one (`n_layers` is missing once the misspelled `n_layer` is
//! removed: one mistake, reported once). Later errors are still found
//! with earlier fields left out, so the output says fixing one can change the next.
//!
//! The table is a `BTreeMap` and validation is a pure function of it, so the list is the same
//! every run.

use super::error::ScenarioError;

/// The most errors one load reports (the first included). A file with more is unusual enough
/// that the first twenty are what to fix first; each one costs a validation.
pub const MAX_ERRORS: usize = 20;

/// `first` (the error validation of `table` stopped at), with [`ScenarioError::also`] filled
/// by knocking out fields one by one and validating again with `check`.
pub(crate) fn knock_out(
    mut first: ScenarioError,
    mut table: toml::Table,
    mut check: impl FnMut(&toml::Table) -> Result<(), ScenarioError>,
) -> ScenarioError {
    let mut removed: Vec<String> = Vec::new();
    let mut field = first.field.clone();
    while first.also.len() + 1 < MAX_ERRORS && remove(&mut table, &field) {
        removed.push(field);
        let next = match check(&table) {
            Ok(()) => break,
            Err(e) => e,
        };
        if removed.iter().any(|r| caused_by(&next, r) || in_place_of(&next, r, &table)) {
            break;
        }
        field = next.field.clone();
        first.also.push((next.field, next.message));
    }
    first
}

/// Removes the dotted `field` from `table`; false when the table does not hold it (so there is
/// nothing the user wrote to leave out).
fn remove(table: &mut toml::Table, field: &str) -> bool {
    if field.is_empty() {
        return false;
    }
    let mut t = table;
    let mut parts = field.split('.').peekable();
    while let Some(p) = parts.next() {
        if parts.peek().is_none() {
            return t.remove(p).is_some();
        }
        t = match t.get_mut(p) {
            Some(toml::Value::Table(sub)) => sub,
            _ => return false,
        };
    }
    false
}

/// Whether `e` may be an effect of removing the dotted field `r` rather than a mistake of its
/// own: it names `r`, a field inside it or the table holding it, or its message mentions `r`
/// (`parallel.tensor`, `parallel.tensor.x`) or `r`'s last key as a setting (`tensor = 2`).
fn caused_by(e: &ScenarioError, r: &str) -> bool {
    let related = |a: &str, b: &str| a == b || a.strip_prefix(b).is_some_and(|rest| rest.starts_with('.'));
    if !e.field.is_empty() && (related(&e.field, r) || related(r, &e.field)) {
        return true;
    }
    let leaf = r.rsplit('.').next().unwrap_or(r);
    mentions(&e.message, r, |_| true) || mentions(&e.message, leaf, |after| after.trim_start().starts_with('='))
}

/// Whether `e` names a field not written beside the removed `r` (same table): a misspelled
/// key's removal leaves the key it meant missing (`n_layer` for `n_layers`, `gpu_count` for
/// `gpus`), one mistake that must not be reported twice.
fn in_place_of(e: &ScenarioError, r: &str, table: &toml::Table) -> bool {
    let parent = |f: &str| f.rsplit_once('.').map_or("", |(p, _)| p).to_string();
    !e.field.is_empty() && parent(&e.field) == parent(r) && !holds(table, &e.field)
}

/// Whether `table` holds the dotted `field`.
fn holds(table: &toml::Table, field: &str) -> bool {
    let mut t = table;
    let mut parts = field.split('.').peekable();
    while let Some(p) = parts.next() {
        match (t.get(p), parts.peek()) {
            (None, _) => return false,
            (Some(_), None) => return true,
            (Some(toml::Value::Table(sub)), Some(_)) => t = sub,
            (Some(_), Some(_)) => return false,
        }
    }
    false
}

/// Whether `text` holds `name` as a whole word (not inside a longer name or dotted path; a
/// path may end a sentence, "... parallel.tensor.") followed by text that `after` accepts.
fn mentions(text: &str, name: &str, after: impl Fn(&str) -> bool) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(name).any(|(i, _)| {
        let rest = &text[i + name.len()..];
        !text[..i].ends_with(|c: char| word(c) || c == '.') && !rest.starts_with(word) && after(rest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn err(field: &str, message: &str) -> ScenarioError {
        ScenarioError::new(Path::new("s.toml"), field, message)
    }

    fn table(src: &str) -> toml::Table {
        toml::from_str(src).unwrap()
    }

    #[test]
    fn removes_only_fields_the_table_holds() {
        let mut t = table("a = 1\n[b]\nc = 2\n[b.d]\ne = 3\n");
        assert!(!remove(&mut t, ""));
        assert!(!remove(&mut t, "x"));
        assert!(!remove(&mut t, "a.x"), "a is not a table");
        assert!(!remove(&mut t, "b.x"));
        assert!(remove(&mut t, "b.d.e"));
        assert!(remove(&mut t, "b.c"));
        assert!(remove(&mut t, "a"));
        assert_eq!(t, table("[b]\n[b.d]\n"));
    }

    #[test]
    fn a_missing_field_beside_a_removed_key_may_be_the_key_meant() {
        let t = table("[model]\nn_layer = 2\nhidden = 8\n[training]\nx = 1\n");
        let r = "model.n_layer";
        assert!(in_place_of(&err("model.n_layers", "is required"), r, &t));
        assert!(!in_place_of(&err("model.hidden", "bad"), r, &t), "written");
        assert!(!in_place_of(&err("training.steps", "bad"), r, &t), "another table");
        assert!(!in_place_of(&err("model.moe.k", "bad"), r, &t), "another table");
        assert!(!in_place_of(&err("", "bad"), r, &t));
        assert!(holds(&t, "model.hidden") && holds(&t, "model") && !holds(&t, "model.hidden.x"));
    }

    #[test]
    fn an_error_about_a_removed_field_or_naming_it_is_the_knock_out_s() {
        let r = "parallel.tensor";
        assert!(caused_by(&err("parallel.tensor", "is required"), r));
        assert!(caused_by(&err("parallel", "bad"), r));
        assert!(caused_by(&err("parallel.tensor.x", "bad"), r));
        assert!(caused_by(&err("parallel.pipeline", "x must divide parallel.tensor (1)"), r));
        assert!(caused_by(&err("parallel.pipeline", "needs parallel.tensor."), r));
        assert!(caused_by(&err("parallel.pipeline", "with tensor = 1"), r));
        assert!(!caused_by(&err("parallel.tensor_x", "bad"), r));
        assert!(!caused_by(&err("parallel.pipeline", "x must divide parallel.tensor_x (1)"), r));
        assert!(!caused_by(&err("parallel.pipeline", "x must divide myparallel.tensor"), r));
        assert!(!caused_by(&err("parallel.pipeline", "the tensor ranks"), r));
        assert!(!caused_by(&err("parallel.pipeline", "model.tensor = 1"), r));
        assert!(!caused_by(&err("", "too large"), r));
    }

    #[test]
    fn collects_until_validation_passes_or_an_error_is_the_knock_out_s() {
        let t = table("a = 1\nb = 2\nc = 3\n");
        // Each key is an error of its own while present.
        let each = |t: &toml::Table| match ["a", "b", "c"].iter().find(|k| t.contains_key(**k)) {
            Some(k) => Err(err(k, "bad")),
            None => Ok(()),
        };
        let e = knock_out(err("a", "bad"), t.clone(), each);
        assert_eq!(e.also, vec![("b".to_string(), "bad".to_string()), ("c".to_string(), "bad".to_string())]);

        // "a is required" once a is gone: not reported, and nothing after it.
        let required =
            |t: &toml::Table| if t.contains_key("a") { Err(err("b", "bad")) } else { Err(err("a", "is required")) };
        assert!(knock_out(err("a", "bad"), t.clone(), required).also.is_empty());

        // An error about a field not written is reported, and ends recovery...
        let missing = |_: &toml::Table| Err(err("z.y", "is missing"));
        assert_eq!(knock_out(err("a", "bad"), t.clone(), missing).also.len(), 1);
        // ... unless a key beside it was removed: it may be the one meant (a misspelling).
        let misspelt = |_: &toml::Table| Err(err("z", "is missing"));
        assert!(knock_out(err("a", "bad"), t.clone(), misspelt).also.is_empty());

        // A whole-file first error: nothing to remove.
        assert!(knock_out(err("", "bad"), t, each).also.is_empty());
    }

    #[test]
    fn stops_at_the_cap() {
        let src: String = (0..50).map(|i| format!("k{i:02} = 1\n")).collect();
        let first_key = |t: &toml::Table| match t.keys().next() {
            Some(k) => Err(err(k, "bad")),
            None => Ok(()),
        };
        let e = knock_out(err("k00", "bad"), table(&src), first_key);
        assert_eq!(e.also.len() + 1, MAX_ERRORS);
        assert_eq!(e.also.last().map(|(f, _)| f.as_str()), Some("k19"));
    }
}
