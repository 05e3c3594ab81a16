//! Which kernel functions a packet tracer like pwru can really follow on the running kernel.
//!
//! pwru 1.0.12 selects a function only when all of these hold (its `GetFuncs`): the BTF
//! `FUNC` name matches the filter; the name is a line of tracefs's
//! `available_filter_functions`; and one of its first five parameters is a pointer directly
//! to `struct sk_buff` (a `const struct sk_buff *` or a typedef does not count). Anything
//! else it skips without a word, so a request must only name functions that pass.
//! [`KernelFunctions`] reads the kernel's BTF and that list once and answers per name.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use libbpf_rs::btf::types::{Func, FuncProto};
use libbpf_rs::btf::Btf;
use libbpf_rs::btf::{BtfKind, BtfType};

/// Where tracefs lists the functions kprobes may attach to (pwru reads the first that opens).
pub const AVAILABLE_FILTER_FUNCTIONS: [&str; 2] = [
    "/sys/kernel/tracing/available_filter_functions",
    "/sys/kernel/debug/tracing/available_filter_functions",
];

/// How many leading parameters pwru looks at for the skb.
const SKB_PARAM_WINDOW: usize = 5;

/// Why a function is or is not traced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// pwru selects it; the skb is parameter `position` (1-based).
    Traced {
        /// 1-based position of the `struct sk_buff *` parameter.
        position: usize,
    },
    /// No BTF function of that name on this kernel (inlined, renamed or absent).
    NotInBtf,
    /// It is in BTF but none of its first five parameters is a `struct sk_buff *`; the
    /// text says what the skb-like parameter is, e.g. `const struct sk_buff *`.
    NoSkbPointer(String),
    /// It is in BTF with an skb pointer but not in `available_filter_functions`
    /// (notrace, or not attachable by kprobe on this build).
    NotTraceable,
}

impl Verdict {
    /// Whether pwru attaches to it.
    pub fn is_traced(&self) -> bool {
        matches!(self, Verdict::Traced { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Traced { position } => write!(f, "traced (skb is parameter {position})"),
            Verdict::NotInBtf => f.write_str("not in the kernel's BTF"),
            Verdict::NoSkbPointer(what) => write!(
                f,
                "no `struct sk_buff *` among its first {SKB_PARAM_WINDOW} parameters ({what})"
            ),
            Verdict::NotTraceable => f.write_str("not in available_filter_functions"),
        }
    }
}

/// Why the kernel facts could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KernelFunctionsError {
    /// The BTF could not be parsed.
    #[error("cannot read BTF from {path}: {source}")]
    Btf {
        /// The file.
        path: PathBuf,
        /// libbpf's error.
        source: libbpf_rs::Error,
    },
}

/// The running kernel's skb functions as pwru sees them.
#[derive(Debug, Clone)]
pub struct KernelFunctions {
    /// BTF function name → the best verdict among its BTF entries (static functions of
    /// the same name in several files each have one).
    btf: HashMap<String, Verdict>,
    /// The lines of `available_filter_functions`, or why it could not be read.
    available: Result<HashSet<String>, String>,
}

impl KernelFunctions {
    /// Read `/sys/kernel/btf/vmlinux` and tracefs's list, as pwru does.
    pub fn load() -> Result<Self, KernelFunctionsError> {
        let available = read_available(&AVAILABLE_FILTER_FUNCTIONS.map(Path::new));
        Self::from_parts(Path::new("/sys/kernel/btf/vmlinux"), available)
    }

    /// From a BTF file and a list of traceable functions (`Err` with why, when there is
    /// none: then every function is judged on BTF alone, see [`Self::available_error`]).
    pub fn from_parts(
        btf_path: &Path,
        available: Result<HashSet<String>, String>,
    ) -> Result<Self, KernelFunctionsError> {
        let btf = Btf::from_path(btf_path).map_err(|source| KernelFunctionsError::Btf {
            path: btf_path.to_owned(),
            source,
        })?;
        let mut verdicts: HashMap<String, Verdict> = HashMap::new();
        for func in btf.type_by_kind::<Func<'_>>() {
            let Some(name) = func.name().and_then(|n| n.to_str()) else {
                continue;
            };
            let verdict = skb_param(&btf, &func);
            match verdicts.get(name) {
                Some(v) if v.is_traced() => {}
                _ => {
                    verdicts.insert(name.to_owned(), verdict);
                }
            }
        }
        Ok(KernelFunctions {
            btf: verdicts,
            available,
        })
    }

    /// The table cut down to what judging `names` needs. The whole table holds every
    /// function of the kernel's BTF and the traceable list: megabytes that a daemon asking
    /// about a few dozen names would keep for its lifetime.
    pub fn keep_only<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        let names: HashSet<&str> = names.into_iter().collect();
        self.btf.retain(|n, _| names.contains(n.as_str()));
        self.btf.shrink_to_fit();
        if let Ok(list) = &mut self.available {
            list.retain(|n| names.contains(n.as_str()));
            list.shrink_to_fit();
        }
        self
    }

    /// Why `available_filter_functions` could not be read (pwru then selects nothing and
    /// exits "Cannot find a matching kernel function"), or `None` when it was read.
    pub fn available_error(&self) -> Option<&str> {
        self.available.as_ref().err().map(String::as_str)
    }

    /// The verdict for one function name. Without a list of traceable functions only the
    /// BTF part of the rule is applied.
    pub fn verdict(&self, name: &str) -> Verdict {
        match self.btf.get(name) {
            None => Verdict::NotInBtf,
            Some(v @ Verdict::Traced { .. }) => match &self.available {
                Ok(list) if !list.contains(name) => Verdict::NotTraceable,
                _ => v.clone(),
            },
            Some(v) => v.clone(),
        }
    }

    /// Split `names` into the ones pwru traces and the others with their verdicts,
    /// keeping the order.
    pub fn select<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> (Vec<&'a str>, Vec<(&'a str, Verdict)>) {
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for n in names {
            match self.verdict(n) {
                Verdict::Traced { .. } => kept.push(n),
                v => dropped.push((n, v)),
            }
        }
        (kept, dropped)
    }

    /// Every BTF function pwru would trace here, sorted (for stand-ins and diagnostics).
    pub fn traced(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .btf
            .keys()
            .map(String::as_str)
            .filter(|n| self.verdict(n).is_traced())
            .collect();
        v.sort_unstable();
        v
    }
}

/// The first of `paths` that reads, one function per line as pwru keys them.
pub fn read_available(paths: &[&Path]) -> Result<HashSet<String>, String> {
    let mut why = Vec::new();
    for p in paths {
        match std::fs::read_to_string(p) {
            Ok(text) => return Ok(text.lines().map(str::to_owned).collect()),
            Err(e) => why.push(format!("{}: {e}", p.display())),
        }
    }
    Err(why.join("; "))
}

/// pwru's test: a parameter among the first five whose type is `PTR` → `STRUCT sk_buff`.
fn skb_param(btf: &Btf<'_>, func: &Func<'_>) -> Verdict {
    let Some(proto) = func.next_type().and_then(|t| FuncProto::try_from(t).ok()) else {
        return Verdict::NoSkbPointer("no prototype".to_owned());
    };
    let mut near_miss = None;
    for (i, p) in proto.iter().enumerate().take(SKB_PARAM_WINDOW) {
        let Some(ty) = btf.type_by_id::<BtfType<'_>>(p.ty) else {
            continue;
        };
        if ty.kind() != BtfKind::Ptr {
            continue;
        }
        let Some(target) = ty.next_type() else {
            continue;
        };
        if target.kind() == BtfKind::Struct && is_sk_buff(&target) {
            return Verdict::Traced { position: i + 1 };
        }
        // Remember why a pointer to an skb behind a modifier or typedef does not count.
        let bare = target.skip_mods_and_typedefs();
        if near_miss.is_none() && bare.kind() == BtfKind::Struct && is_sk_buff(&bare) {
            let how = match target.kind() {
                BtfKind::Const => "const struct sk_buff *",
                BtfKind::Volatile => "volatile struct sk_buff *",
                BtfKind::Typedef => "a typedef of struct sk_buff *",
                _ => "a qualified struct sk_buff *",
            };
            near_miss = Some(format!("parameter {} is {how}", i + 1));
        }
    }
    Verdict::NoSkbPointer(near_miss.unwrap_or_else(|| "no skb parameter".to_owned()))
}

fn is_sk_buff(t: &BtfType<'_>) -> bool {
    t.name().and_then(|n| n.to_str()) == Some("sk_buff")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Option<KernelFunctions> {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return None;
        }
        Some(KernelFunctions::from_parts(path, Err("not read in this test".to_owned())).unwrap())
    }

    #[test]
    fn pwrus_rule_on_the_running_kernels_btf() {
        let Some(k) = host() else { return };
        // Taking `struct sk_buff *skb` first: selected.
        assert_eq!(k.verdict("tcp_v4_rcv"), Verdict::Traced { position: 1 });
        // `struct sock *sk, struct sk_buff *skb`: the second parameter counts.
        assert_eq!(k.verdict("tcp_data_queue"), Verdict::Traced { position: 2 });
        // The function issue 9 found pwru ignoring: `const struct sk_buff *`.
        assert_eq!(
            k.verdict("skb_copy_datagram_iter"),
            Verdict::NoSkbPointer("parameter 1 is const struct sk_buff *".to_owned())
        );
        assert_eq!(k.verdict("no_such_function_here"), Verdict::NotInBtf);
        // No skb at all.
        assert!(matches!(
            k.verdict("tcp_recv_timestamp"),
            Verdict::NotInBtf | Verdict::NoSkbPointer(_)
        ));
        assert!(k.traced().contains(&"tcp_v4_rcv"));
        assert!(!k.traced().contains(&"skb_copy_datagram_iter"));
    }

    #[test]
    fn the_available_list_narrows_the_btf_verdict() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        }
        let only = HashSet::from(["tcp_v4_rcv".to_owned()]);
        let k = KernelFunctions::from_parts(path, Ok(only)).unwrap();
        assert!(k.available_error().is_none());
        let (kept, dropped) = k.select(["tcp_v4_rcv", "tcp_data_queue", "skb_copy_datagram_iter"]);
        assert_eq!(kept, ["tcp_v4_rcv"]);
        assert_eq!(dropped[0], ("tcp_data_queue", Verdict::NotTraceable));
        assert!(matches!(dropped[1].1, Verdict::NoSkbPointer(_)));
    }

    #[test]
    fn a_table_cut_to_some_names_judges_them_as_the_whole_one_did() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        }
        let names = [
            "tcp_v4_rcv",
            "tcp_data_queue",
            "skb_copy_datagram_iter",
            "no_such_fn",
        ];
        let only = HashSet::from(["tcp_v4_rcv".to_owned(), "udp_rcv".to_owned()]);
        let whole = KernelFunctions::from_parts(path, Ok(only)).unwrap();
        let cut = whole.clone().keep_only(names);
        for n in names {
            assert_eq!(cut.verdict(n), whole.verdict(n), "{n}");
        }
        // Only the names asked about are kept.
        assert_eq!(cut.btf.len(), 3);
        assert_eq!(cut.traced(), ["tcp_v4_rcv"]);
        assert!(whole.btf.len() > 1000);
    }

    #[test]
    fn unreadable_list_is_reported() {
        let e = read_available(&[Path::new("/nonexistent/available_filter_functions")]);
        assert!(
            e.unwrap_err().contains("/nonexistent"),
            "message names the path"
        );
    }
}
