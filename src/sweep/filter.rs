//! Filter constraints: `micro_batch * grad_accum * dp = 1024`, `parallel.sharding != "none"`.
//!
//! A constraint is one comparison (`=` or `==`, `!=`, `<`, `<=`, `>`, `>=`) of two
//! expressions over numbers (`+ - * / %`, parentheses), strings and booleans. Names are the
//! derived quantities below (from the validated scenario, defaults applied), any scenario
//! field by its dotted path (`model.hidden`, `parallel.sharding`), or an axis by the last part
//! of its path (`sharding` for `parallel.sharding`).

use super::spec::{get_path, Axis};
use crate::scenario::Scenario;

/// Quantities a filter can name directly: `(name, dotted alias, what it is)`.
pub const DERIVED: &[(&str, Option<&str>, &str)] = &[
    ("gpus", Some("hardware.gpus"), "GPUs in the job"),
    ("dp", None, "data-parallel degree: gpus / (parallel.tensor x parallel.pipeline x parallel.context)"),
    ("nodes", None, "gpus / gpus_per_node"),
    ("gpus_per_node", Some("hardware.gpus_per_node"), "GPUs per node"),
    ("micro_batch", Some("training.micro_batch"), "sequences per GPU per micro-batch"),
    ("grad_accum", Some("training.grad_accum"), "micro-batches per optimizer step"),
    ("seq_len", Some("training.seq_len"), "tokens per sequence"),
    ("steps", Some("training.steps"), "simulated steps"),
    ("global_batch", None, "micro_batch * grad_accum * dp (sequences per optimizer step)"),
    ("tokens_per_step", None, "global_batch * seq_len"),
    ("params", None, "model parameters"),
];

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Num(f64),
    Str(String),
    Bool(bool),
}

impl Val {
    fn kind(&self) -> &'static str {
        match self {
            Val::Num(_) => "a number",
            Val::Str(_) => "a string",
            Val::Bool(_) => "a boolean",
        }
    }
}

#[derive(Debug, Clone)]
enum Expr {
    Lit(Val),
    Derived(usize),
    Path(String),
    Neg(Box<Expr>),
    Bin(Box<Expr>, char, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One parsed constraint.
#[derive(Debug, Clone)]
pub struct Constraint {
    pub text: String,
    lhs: Expr,
    cmp: Cmp,
    rhs: Expr,
}

/// What a constraint is evaluated against: the configuration's TOML tree and, once it
/// validated, the scenario (derived quantities then include every default). Without one, the
/// derived quantities come from the tree with the scenario format's defaults, so a filter can
/// drop combinations that would not validate (`gpus % gpus_per_node = 0`).
pub struct Env<'a> {
    pub scenario: Option<&'a Scenario>,
    pub tree: &'a toml::Table,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Str(String),
    Ident(String),
    Op(&'static str),
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                // An exponent's sign belongs to the number.
                if (b[i] == b'e' || b[i] == b'E') && matches!(b.get(i + 1), Some(b'+' | b'-')) {
                    i += 1;
                }
                i += 1;
            }
            let text: String = s[start..i].chars().filter(|&c| c != '_').collect();
            let n = text.parse::<f64>().map_err(|_| format!("`{}` is not a number", &s[start..i]))?;
            if !n.is_finite() {
                return Err(format!("`{}` is beyond the largest number (about 1.8e308)", &s[start..i]));
            }
            out.push(Tok::Num(n));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].to_string()));
        } else if c == '"' || c == '\'' {
            let end = s[i + 1..].find(c).ok_or_else(|| format!("unterminated string starting at column {}", i + 1))?;
            out.push(Tok::Str(s[i + 1..i + 1 + end].to_string()));
            i += end + 2;
        } else {
            let two = s.get(i..i + 2).unwrap_or("");
            let op: &'static str = match two {
                "==" => "==",
                "!=" => "!=",
                "<=" => "<=",
                ">=" => ">=",
                _ => match c {
                    '=' => "=",
                    '<' => "<",
                    '>' => ">",
                    '+' => "+",
                    '-' => "-",
                    '*' => "*",
                    '/' => "/",
                    '%' => "%",
                    '(' => "(",
                    ')' => ")",
                    _ => return Err(format!("unexpected `{c}` at column {}", i + 1)),
                },
            };
            i += op.len();
            out.push(Tok::Op(op));
        }
    }
    Ok(out)
}

/// The deepest nesting of parentheses and signs a constraint may have, and its most tokens:
/// parsing and evaluating recurse that deep, so the bound keeps them within the stack.
pub const MAX_FILTER_DEPTH: usize = 64;
pub const MAX_FILTER_TOKENS: usize = 1000;

struct Parser<'a> {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    axes: &'a [Axis],
    base: &'a toml::Table,
}

impl Parser<'_> {
    fn peek_op(&self) -> Option<&'static str> {
        match self.toks.get(self.pos) {
            Some(Tok::Op(o)) => Some(o),
            _ => None,
        }
    }

    fn sum(&mut self) -> Result<Expr, String> {
        let mut e = self.term()?;
        while let Some(op @ ("+" | "-")) = self.peek_op() {
            self.pos += 1;
            let r = self.term()?;
            e = Expr::Bin(Box::new(e), op.chars().next().unwrap_or('+'), Box::new(r));
        }
        Ok(e)
    }

    fn term(&mut self) -> Result<Expr, String> {
        let mut e = self.factor()?;
        while let Some(op @ ("*" | "/" | "%")) = self.peek_op() {
            self.pos += 1;
            let r = self.factor()?;
            e = Expr::Bin(Box::new(e), op.chars().next().unwrap_or('*'), Box::new(r));
        }
        Ok(e)
    }

    fn factor(&mut self) -> Result<Expr, String> {
        let t = self.toks.get(self.pos).cloned().ok_or("the expression ends too early")?;
        self.pos += 1;
        let nests = matches!(t, Tok::Op("(" | "-"));
        if nests {
            self.depth += 1;
            if self.depth > MAX_FILTER_DEPTH {
                return Err(format!("nested deeper than {MAX_FILTER_DEPTH} parentheses or signs"));
            }
        }
        let e = self.factor_of(t);
        if nests {
            self.depth -= 1;
        }
        e
    }

    fn factor_of(&mut self, t: Tok) -> Result<Expr, String> {
        match t {
            Tok::Num(n) => Ok(Expr::Lit(Val::Num(n))),
            Tok::Str(s) => Ok(Expr::Lit(Val::Str(s))),
            Tok::Op("-") => Ok(Expr::Neg(Box::new(self.factor()?))),
            Tok::Op("(") => {
                let e = self.sum()?;
                if self.peek_op() != Some(")") {
                    return Err("missing `)`".into());
                }
                self.pos += 1;
                Ok(e)
            }
            Tok::Op(o) => Err(format!("unexpected `{o}`")),
            Tok::Ident(id) => self.name(&id),
        }
    }

    fn name(&self, id: &str) -> Result<Expr, String> {
        match id {
            "true" => return Ok(Expr::Lit(Val::Bool(true))),
            "false" => return Ok(Expr::Lit(Val::Bool(false))),
            _ => {}
        }
        if let Some(k) = DERIVED.iter().position(|(n, alias, _)| *n == id || *alias == Some(id)) {
            return Ok(Expr::Derived(k));
        }
        if id.contains('.') {
            if self.axes.iter().any(|a| a.path == id) || get_path(self.base, id).is_some() {
                return Ok(Expr::Path(id.to_string()));
            }
            return Err(format!(
                "`{id}` is neither an axis nor set in the base scenario (set it there, or use a name: {})",
                known_names()
            ));
        }
        let matches: Vec<&Axis> = self.axes.iter().filter(|a| a.path.rsplit('.').next() == Some(id)).collect();
        match matches.len() {
            1 => Ok(Expr::Path(matches[0].path.clone())),
            0 => Err(format!(
                "unknown name `{id}`; names: {}, an axis by the last part of its path, or a dotted scenario field (e.g. parallel.sharding)",
                known_names()
            )),
            _ => Err(format!(
                "`{id}` could be any of the axes {}; write the dotted path",
                matches.iter().map(|a| format!("`{}`", a.path)).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

fn known_names() -> String {
    DERIVED.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
}

impl Constraint {
    /// Parses `text`, resolving names against the axes and the base scenario's tree.
    pub fn parse(text: &str, axes: &[Axis], base: &toml::Table) -> Result<Constraint, String> {
        let toks = lex(text)?;
        if toks.len() > MAX_FILTER_TOKENS {
            return Err(format!("{} tokens; a constraint has at most {MAX_FILTER_TOKENS}", toks.len()));
        }
        let mut p = Parser { toks, pos: 0, depth: 0, axes, base };
        let lhs = p.sum()?;
        let cmp = match p.peek_op() {
            Some("=" | "==") => Cmp::Eq,
            Some("!=") => Cmp::Ne,
            Some("<") => Cmp::Lt,
            Some("<=") => Cmp::Le,
            Some(">") => Cmp::Gt,
            Some(">=") => Cmp::Ge,
            _ => return Err("a constraint compares two sides: one of =, !=, <, <=, >, >= (e.g. `micro_batch * grad_accum * dp = 1024`)".into()),
        };
        p.pos += 1;
        let rhs = p.sum()?;
        if p.pos != p.toks.len() {
            return Err("unexpected text after the comparison (one comparison per constraint; list several constraints instead)".into());
        }
        Ok(Constraint { text: text.to_string(), lhs, cmp, rhs })
    }

    /// Whether the configuration satisfies the constraint.
    pub fn eval(&self, env: &Env) -> Result<bool, String> {
        let l = eval(&self.lhs, env)?;
        let r = eval(&self.rhs, env)?;
        match (&l, &r) {
            (Val::Num(a), Val::Num(b)) => {
                // Integers are exact in f64; a tolerance keeps `0.1 * 3 = 0.3` true.
                let eq = (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
                Ok(match self.cmp {
                    Cmp::Eq => eq,
                    Cmp::Ne => !eq,
                    Cmp::Lt => a < b && !eq,
                    Cmp::Le => a < b || eq,
                    Cmp::Gt => a > b && !eq,
                    Cmp::Ge => a > b || eq,
                })
            }
            (Val::Str(_), Val::Str(_)) | (Val::Bool(_), Val::Bool(_)) => match self.cmp {
                Cmp::Eq => Ok(l == r),
                Cmp::Ne => Ok(l != r),
                _ => Err(format!("{} can only be compared with = or !=", l.kind())),
            },
            _ => Err(format!("cannot compare {} ({}) with {} ({})", l.kind(), show(&l), r.kind(), show(&r))),
        }
    }
}

fn show(v: &Val) -> String {
    match v {
        Val::Num(n) => format!("{n}"),
        Val::Str(s) => format!("{s:?}"),
        Val::Bool(b) => b.to_string(),
    }
}

fn eval(e: &Expr, env: &Env) -> Result<Val, String> {
    Ok(match e {
        Expr::Lit(v) => v.clone(),
        Expr::Derived(k) => Val::Num(match env.scenario {
            Some(s) => derived(*k, s),
            None => raw_derived(*k, env.tree)
                .ok_or_else(|| format!("`{}` needs a configuration that validates", DERIVED[*k].0))?,
        }),
        Expr::Path(p) => match get_path(env.tree, p) {
            Some(toml::Value::Integer(i)) => Val::Num(*i as f64),
            Some(toml::Value::Float(f)) if f.is_finite() => Val::Num(*f),
            Some(toml::Value::Float(f)) => return Err(format!("`{p}` is {f}, not a finite number")),
            Some(toml::Value::String(s)) => Val::Str(s.clone()),
            Some(toml::Value::Boolean(b)) => Val::Bool(*b),
            Some(other) => return Err(format!("`{p}` is a {}, not a number, string or boolean", other.type_str())),
            None => return Err(format!("`{p}` is not set in this configuration")),
        },
        Expr::Neg(x) => match eval(x, env)? {
            Val::Num(n) => Val::Num(-n),
            v => return Err(format!("cannot negate {}", v.kind())),
        },
        Expr::Bin(a, op, b) => {
            let (x, y) = match (eval(a, env)?, eval(b, env)?) {
                (Val::Num(x), Val::Num(y)) => (x, y),
                (l, r) => return Err(format!("`{op}` needs numbers, got {} and {}", l.kind(), r.kind())),
            };
            let v = match op {
                '+' => x + y,
                '-' => x - y,
                '*' => x * y,
                '/' | '%' if y == 0.0 => return Err("division by zero".into()),
                '/' => x / y,
                _ => x % y,
            };
            // An infinity would compare equal to anything within the relative tolerance.
            if !v.is_finite() {
                return Err(format!("{x} {op} {y} is beyond the largest number (about 1.8e308)"));
            }
            Val::Num(v)
        }
    })
}

fn derived(k: usize, s: &Scenario) -> f64 {
    let gpus = f64::from(s.cluster.gpus);
    let t = &s.training;
    match DERIVED[k].0 {
        "gpus" => gpus,
        "dp" => s.dp_degree() as f64,
        "nodes" => gpus / f64::from(s.cluster.gpus_per_node.max(1)),
        "gpus_per_node" => f64::from(s.cluster.gpus_per_node),
        "micro_batch" => t.micro_batch as f64,
        "grad_accum" => t.grad_accum as f64,
        "seq_len" => t.seq_len as f64,
        "steps" => f64::from(t.steps),
        "global_batch" => (t.micro_batch * t.grad_accum * s.dp_degree()) as f64,
        "tokens_per_step" => s.tokens_per_step() as f64,
        _ => s.model.param_count() as f64,
    }
}

/// A derived quantity from an unvalidated tree, with the scenario format's defaults
/// (`gpus_per_node = min(gpus, 8)`, `grad_accum = 1`, `steps = 2`); None when it needs more.
fn raw_derived(k: usize, tree: &toml::Table) -> Option<f64> {
    let num = |p: &str| match get_path(tree, p) {
        Some(toml::Value::Integer(i)) => Some(*i as f64),
        Some(toml::Value::Float(f)) => Some(*f),
        _ => None,
    };
    let gpus = num("hardware.gpus");
    let gpn = num("hardware.gpus_per_node").or(gpus.map(|g| g.min(8.0)));
    let mb = num("training.micro_batch");
    let ga = num("training.grad_accum").or(Some(1.0));
    let seq = num("training.seq_len");
    // Megatron's data-parallel degree; tensor, pipeline and context default to 1.
    let mp = num("parallel.tensor").unwrap_or(1.0)
        * num("parallel.pipeline").unwrap_or(1.0)
        * num("parallel.context").unwrap_or(1.0);
    let dp = gpus.map(|g| g / mp.max(1.0));
    Some(match DERIVED[k].0 {
        "gpus" => gpus?,
        "dp" => dp?,
        "nodes" => gpus? / gpn?,
        "gpus_per_node" => gpn?,
        "micro_batch" => mb?,
        "grad_accum" => ga?,
        "seq_len" => seq?,
        "steps" => num("training.steps").unwrap_or(2.0),
        "global_batch" => mb? * ga? * dp?,
        "tokens_per_step" => mb? * ga? * dp? * seq?,
        _ => return None,
    })
}
