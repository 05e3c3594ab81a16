//! Read side: incidents by time/service/state, samples of an incident with filters and a
//! summary, pwru records, and the one-incident export bundle.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::ops::Bound;
use std::str::FromStr;

use model::{Flow, Probe, Sample, SampleFlags, Transport};
use serde::{Deserialize, Serialize};

use crate::chunk;
use crate::engine::T;
use crate::error::{Result, StoreError};
use crate::keys;
use crate::model::{Incident, IncidentState, IncidentVerdict, PwruRecord};
use crate::store::Store;

/// Most items one page returns, whatever the caller asks.
pub const MAX_PAGE: usize = 10_000;

/// Which incidents to list. Pages go newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentQuery {
    /// Only incidents still going on at or after this time (ns since the epoch).
    pub since_ns: Option<u64>,
    /// Only incidents opened at or before this time.
    pub until_ns: Option<u64>,
    /// Only this service.
    pub service: Option<String>,
    /// Only this state.
    pub state: Option<IncidentState>,
    /// Paging: only incidents with a smaller id (the previous page's `next_before_id`).
    pub before_id: Option<u64>,
    /// Page size (0 means the maximum, [`MAX_PAGE`]).
    pub limit: usize,
}

/// One page of incidents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentPage {
    /// The incidents, newest first.
    pub incidents: Vec<Incident>,
    /// Pass as `before_id` for the next page; `None` when this was the last.
    pub next_before_id: Option<u64>,
    /// Operators' verdicts on the incidents of this page that have one, by incident id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub verdicts: BTreeMap<u64, IncidentVerdict>,
}

/// A filter on the 5-tuple: every field given must match.
///
/// Parsed from `key=value` words, e.g. `"dport=443 saddr=10.0.0.5 proto=tcp"`; keys are
/// `saddr`, `daddr`, `sport`, `dport`, `proto` (`tcp`, `udp` or a number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowFilter {
    /// Transport protocol.
    pub transport: Option<Transport>,
    /// Source (remote) address.
    pub saddr: Option<IpAddr>,
    /// Destination (local) address.
    pub daddr: Option<IpAddr>,
    /// Source port.
    pub sport: Option<u16>,
    /// Destination port.
    pub dport: Option<u16>,
}

impl FlowFilter {
    /// Does `flow` match?
    pub fn matches(&self, flow: &Flow) -> bool {
        self.transport.is_none_or(|t| t == flow.transport)
            && self.saddr.is_none_or(|a| a == flow.src)
            && self.daddr.is_none_or(|a| a == flow.dst)
            && self.sport.is_none_or(|p| p == flow.sport)
            && self.dport.is_none_or(|p| p == flow.dport)
    }
}

impl FromStr for FlowFilter {
    type Err = String;
    fn from_str(s: &str) -> Result<FlowFilter, String> {
        let mut f = FlowFilter::default();
        for word in s.split_whitespace() {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("flow filter word {word:?} is not key=value"))?;
            let bad = |what: &str| format!("flow filter {key}={value:?}: not {what}");
            match key {
                "saddr" => f.saddr = Some(value.parse().map_err(|_| bad("an IP address"))?),
                "daddr" => f.daddr = Some(value.parse().map_err(|_| bad("an IP address"))?),
                "sport" => f.sport = Some(value.parse().map_err(|_| bad("a port number"))?),
                "dport" => f.dport = Some(value.parse().map_err(|_| bad("a port number"))?),
                "proto" => {
                    f.transport = Some(match value {
                        "tcp" => Transport::Tcp,
                        "udp" => Transport::Udp,
                        n => Transport::from_ip_proto(
                            n.parse().map_err(|_| bad("tcp, udp or a protocol number"))?,
                        ),
                    })
                }
                _ => {
                    return Err(format!(
                        "flow filter key {key:?} unknown (expected saddr, daddr, sport, dport or proto)"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// Which samples of an incident to return or summarise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleFilter {
    /// Only this probe.
    pub probe: Option<Probe>,
    /// Only matching flows.
    pub flow: FlowFilter,
    /// Only samples at least this slow, ns.
    pub min_latency_ns: Option<u64>,
    /// Only samples at or after this time, ns since the epoch.
    pub since_ns: Option<u64>,
    /// Only samples at or before this time.
    pub until_ns: Option<u64>,
}

impl SampleFilter {
    /// Does `s` pass?
    pub fn matches(&self, s: &Sample) -> bool {
        self.probe.is_none_or(|p| p == s.probe)
            && self.min_latency_ns.is_none_or(|m| s.latency_ns >= m)
            && self.flow.matches(&s.flow)
    }
}

/// Paging position within an incident's samples (the last sample returned). The sequence
/// number names the stored chunk and the sample's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleCursor {
    /// Its time.
    pub time_ns: u64,
    /// Its store sequence number.
    pub seq: u64,
    /// Its latency: set in pages slowest first ([`Store::slowest_samples`]), whose order
    /// it is part of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<u64>,
}

/// One page of samples, in stored order: samples are kept in chunks of up to 256, each in
/// time order, and chunks follow each other by their first sample's time. That is exact
/// time order unless two write batches overlapped in time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplePage {
    /// The samples.
    pub samples: Vec<Sample>,
    /// Pass as `after` for the next page; `None` when this was the last.
    pub next: Option<SampleCursor>,
}

impl SamplePage {
    /// The page of the first `limit` of `samples` (with their sequence numbers, in page
    /// order; one more than `limit` when another page exists). The cursor carries the last
    /// sample's latency when the order is by latency.
    fn of(mut samples: Vec<(u64, Sample)>, limit: usize, by_latency: bool) -> SamplePage {
        let more = samples.len() > limit;
        samples.truncate(limit);
        let next = more
            .then(|| samples.last())
            .flatten()
            .map(|(seq, s)| SampleCursor {
                time_ns: s.time_ns,
                seq: *seq,
                latency_ns: by_latency.then_some(s.latency_ns),
            });
        SamplePage {
            samples: samples.into_iter().map(|(_, s)| s).collect(),
            next,
        }
    }
}

/// Exact latency quantiles over a set of samples, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyQuantiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Slowest.
    pub max: u64,
}

/// A flow and how many samples it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowCount {
    /// The flow.
    pub flow: Flow,
    /// Samples.
    pub count: u64,
    /// Slowest of them, ns.
    pub max_latency_ns: u64,
}

/// A process and how many samples were read in its context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessCount {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Samples.
    pub count: u64,
}

/// What the samples of an incident say at a glance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSummary {
    /// Samples matching the filter.
    pub count: u64,
    /// Of those, kept by the flight recorder before the incident opened.
    pub pre_trigger: u64,
    /// Of those, flagged head-of-line suspects.
    pub hol_suspect: u64,
    /// Latency quantiles (`None` without samples).
    pub latency: Option<LatencyQuantiles>,
    /// First and last sample time, ns since the epoch.
    pub first_ns: Option<u64>,
    /// Last sample time.
    pub last_ns: Option<u64>,
    /// Samples per probe.
    pub probes: Vec<(Probe, u64)>,
    /// The busiest flows, most samples first (at most [`SampleSummary::TOP`]).
    pub top_flows: Vec<FlowCount>,
    /// The processes seen most (at most [`SampleSummary::TOP`]).
    pub top_processes: Vec<ProcessCount>,
    /// Samples per CPU, by CPU number.
    pub cpus: Vec<(u32, u64)>,
}

impl SampleSummary {
    /// How many top flows and processes are listed.
    pub const TOP: usize = 10;

    /// Summarise samples (any order).
    pub fn of<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> SampleSummary {
        let mut s = SampleSummary::default();
        let mut latencies = Vec::new();
        let mut probes: HashMap<Probe, u64> = HashMap::new();
        let mut flows: HashMap<Flow, (u64, u64)> = HashMap::new();
        let mut procs: HashMap<(u32, String), u64> = HashMap::new();
        let mut cpus: HashMap<u32, u64> = HashMap::new();
        for x in samples {
            s.count += 1;
            s.pre_trigger += u64::from(x.flags.contains(SampleFlags::PRE_TRIGGER));
            s.hol_suspect += u64::from(x.flags.contains(SampleFlags::HOL_SUSPECT));
            latencies.push(x.latency_ns);
            s.first_ns = Some(s.first_ns.map_or(x.time_ns, |t| t.min(x.time_ns)));
            s.last_ns = Some(s.last_ns.map_or(x.time_ns, |t| t.max(x.time_ns)));
            *probes.entry(x.probe).or_default() += 1;
            let f = flows.entry(x.flow).or_default();
            f.0 += 1;
            f.1 = f.1.max(x.latency_ns);
            if let Some(pid) = x.pid {
                *procs.entry((pid, x.comm.to_string())).or_default() += 1;
            }
            *cpus.entry(x.cpu).or_default() += 1;
        }
        latencies.sort_unstable();
        s.latency = quantiles(&latencies);
        s.probes = probes.into_iter().collect();
        s.probes.sort();
        let mut flows: Vec<FlowCount> = flows
            .into_iter()
            .map(|(flow, (count, max))| FlowCount {
                flow,
                count,
                max_latency_ns: max,
            })
            .collect();
        flows.sort_by(|a, b| b.count.cmp(&a.count).then(a.flow.cmp(&b.flow)));
        flows.truncate(Self::TOP);
        s.top_flows = flows;
        let mut procs: Vec<ProcessCount> = procs
            .into_iter()
            .map(|((pid, comm), count)| ProcessCount { pid, comm, count })
            .collect();
        procs.sort_by(|a, b| b.count.cmp(&a.count).then(a.pid.cmp(&b.pid)));
        procs.truncate(Self::TOP);
        s.top_processes = procs;
        s.cpus = cpus.into_iter().collect();
        s.cpus.sort();
        s
    }
}

/// Nearest-rank quantiles of sorted values.
fn quantiles(sorted: &[u64]) -> Option<LatencyQuantiles> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let at = |q: f64| -> Option<u64> {
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        sorted.get(rank - 1).copied()
    };
    Some(LatencyQuantiles {
        p50: at(0.5)?,
        p90: at(0.9)?,
        p99: at(0.99)?,
        max: *sorted.last()?,
    })
}

/// One incident with everything stored about it, for `tailtrap export`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IncidentBundle {
    /// Format marker for readers of the file.
    pub format: &'static str,
    /// The incident.
    pub incident: Incident,
    /// The operator's verdict, if one was given (`tailtrap incidents mark`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<IncidentVerdict>,
    /// Summary of all its samples.
    pub summary: SampleSummary,
    /// All its samples, in time order.
    pub samples: Vec<Sample>,
    /// All its pwru records, in order.
    pub pwru: Vec<PwruRecord>,
}

fn page_limit(limit: usize) -> usize {
    if limit == 0 {
        MAX_PAGE
    } else {
        limit.min(MAX_PAGE)
    }
}

impl Store {
    /// Incidents matching `q`, newest first, one page.
    pub fn incidents(&self, q: &IncidentQuery) -> Result<IncidentPage> {
        let limit = page_limit(q.limit);
        let end = keys::incident(q.before_id.unwrap_or(u64::MAX)).to_vec();
        let mut out = Vec::new();
        let mut next = None;
        for (_, inc) in self
            .scan::<Incident>(T::Incidents, ..end)?
            .into_iter()
            .rev()
        {
            let live_in_range = q
                .since_ns
                .is_none_or(|s| inc.closed_ns.is_none_or(|c| c >= s))
                && q.until_ns.is_none_or(|u| inc.opened_ns <= u);
            if !live_in_range
                || q.service.as_ref().is_some_and(|s| *s != inc.service)
                || q.state.is_some_and(|st| st != inc.state)
            {
                continue;
            }
            if out.len() == limit {
                next = out.last().map(|i: &Incident| i.id);
                break;
            }
            out.push(inc);
        }
        let mut verdicts = BTreeMap::new();
        for inc in &out {
            if let Some(v) = self.verdict(inc.id)? {
                verdicts.insert(inc.id, v);
            }
        }
        Ok(IncidentPage {
            incidents: out,
            next_before_id: next,
            verdicts,
        })
    }

    /// Samples of an incident matching `filter`, one page after `after`. Time order within
    /// each stored batch, batches by their first sample's time (see [`SamplePage`]).
    pub fn samples(
        &self,
        incident: u64,
        filter: &SampleFilter,
        after: Option<SampleCursor>,
        limit: usize,
    ) -> Result<SamplePage> {
        self.require_incident(incident)?;
        let limit = page_limit(limit);
        // One more than asked tells whether another page exists.
        let mut samples: Vec<(u64, Sample)> = Vec::new();
        self.for_each_sample(incident, filter, after, |seq, s| {
            samples.push((seq, s));
            samples.len() <= limit
        })?;
        Ok(SamplePage::of(samples, limit, false))
    }

    /// Samples of an incident matching `filter`, slowest first (equal latencies by sequence
    /// number, i.e. in the order they were written), one page after `after` (a cursor of this order, with its latency). Reads
    /// every matching sample and keeps only a page and a half's worth at a time.
    pub fn slowest_samples(
        &self,
        incident: u64,
        filter: &SampleFilter,
        after: Option<SampleCursor>,
        limit: usize,
    ) -> Result<SamplePage> {
        self.require_incident(incident)?;
        let limit = page_limit(limit);
        let slowest_first = |a: &(u64, Sample), b: &(u64, Sample)| {
            b.1.latency_ns.cmp(&a.1.latency_ns).then(a.0.cmp(&b.0))
        };
        // One more than asked tells whether another page exists.
        let keep = limit + 1;
        let mut best: Vec<(u64, Sample)> = Vec::with_capacity(keep + keep / 2);
        self.for_each_sample(incident, filter, None, |seq, s| {
            let past_cursor = after.is_none_or(|c| {
                let at = c.latency_ns.unwrap_or(u64::MAX);
                s.latency_ns < at || (s.latency_ns == at && seq > c.seq)
            });
            if past_cursor {
                best.push((seq, s));
                if best.len() >= keep + keep / 2 {
                    best.select_nth_unstable_by(keep - 1, slowest_first);
                    best.truncate(keep);
                }
            }
            true
        })?;
        best.sort_unstable_by(slowest_first);
        Ok(SamplePage::of(best, limit, true))
    }

    /// Summary of an incident's samples matching `filter`.
    pub fn sample_summary(&self, incident: u64, filter: &SampleFilter) -> Result<SampleSummary> {
        self.require_incident(incident)?;
        let mut all = Vec::new();
        self.for_each_sample(incident, filter, None, |_, s| {
            all.push(s);
            true
        })?;
        Ok(SampleSummary::of(&all))
    }

    /// Visit matching samples in stored order (chunks by their first sample's time, each
    /// chunk in time order) until `f` returns false. `f` gets each sample's sequence number.
    fn for_each_sample(
        &self,
        incident: u64,
        filter: &SampleFilter,
        after: Option<SampleCursor>,
        mut f: impl FnMut(u64, Sample) -> bool,
    ) -> Result<()> {
        let first = keys::sample(incident, 0, 0).to_vec();
        // A chunk starting after `until` holds nothing wanted; one starting before `since`
        // may still hold later samples, so the start is the incident's first chunk.
        let last = keys::sample(incident, filter.until_ns.unwrap_or(u64::MAX), u64::MAX).to_vec();
        let tree = self.tree_outside(T::Samples);
        // Resume inside the record holding the cursor's sample: a record keyed by the
        // cursor itself (a chunk's first sample, or a schema-1 one-sample record), else the
        // chunk named by its sequence number, which starts at or before the cursor's time.
        let mut resume: Option<(u64, u64)> = None;
        let start = match after {
            None => Bound::Included(first.clone()),
            Some(c) => {
                let exact = keys::sample(incident, c.time_ns, c.seq).to_vec();
                let at_cursor = keys::sample(incident, c.time_ns, u64::MAX).to_vec();
                let mut found = tree.get(&exact)?.map(|_| (exact.clone(), c.seq));
                if found.is_none() {
                    let chunk_seq = chunk::chunk_start(c.seq);
                    for item in tree.range(first.clone()..=at_cursor.clone()).rev() {
                        let (k, v) = item?;
                        if keys::u64_at(&k, 16) == Some(chunk_seq) && chunk::is_chunk(&v) {
                            found = Some((k.to_vec(), chunk_seq));
                            break;
                        }
                    }
                }
                match found {
                    Some((k, record_seq)) => {
                        // Samples up to and including the cursor's were on earlier pages.
                        resume = Some((record_seq, c.seq - record_seq + 1));
                        Bound::Included(k)
                    }
                    // The chunk is gone (retention): carry on after the cursor's time.
                    None => Bound::Excluded(at_cursor),
                }
            }
        };
        for item in tree.range((start, Bound::Included(last))) {
            let (k, v) = item?;
            let chunk_seq = keys::u64_at(&k, 16).unwrap_or(0);
            let Some(samples) = self.decode_chunk_counted(&k, &v) else {
                continue;
            };
            let skip = match resume.take() {
                Some((seq, skip)) if seq == chunk_seq => skip,
                _ => 0,
            };
            for (index, s) in (0u64..).zip(samples).skip(skip as usize) {
                if filter.since_ns.is_some_and(|t| s.time_ns < t)
                    || filter.until_ns.is_some_and(|t| s.time_ns > t)
                    || !filter.matches(&s)
                {
                    continue;
                }
                if !f(chunk_seq + index, s) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// pwru records of an incident in order, those with `seq > after_seq`, one page.
    pub fn pwru_records(
        &self,
        incident: u64,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Vec<PwruRecord>> {
        self.require_incident(incident)?;
        let limit = page_limit(limit);
        let start = match after_seq {
            Some(s) if s == u64::MAX => return Ok(Vec::new()),
            Some(s) => keys::pwru(incident, s + 1),
            None => keys::pwru(incident, 0),
        };
        let end = keys::pwru(incident, u64::MAX);
        let tree = self.tree_outside(T::Pwru);
        let mut out = Vec::new();
        for item in tree.range(start..=end) {
            let (k, v) = item?;
            if let Some(r) = self.decode_counted(T::Pwru, &k, &v) {
                out.push(r);
                if out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Everything about one incident, for export as one JSON document.
    pub fn export_incident(&self, incident: u64) -> Result<IncidentBundle> {
        let inc = self
            .incident(incident)?
            .ok_or(StoreError::NoSuchIncident(incident))?;
        let mut samples = Vec::new();
        self.for_each_sample(incident, &SampleFilter::default(), None, |_, s| {
            samples.push(s);
            true
        })?;
        // Chunks of batches that overlapped in time follow each other; the bundle is in
        // time order (stable: equal times keep their stored order).
        samples.sort_by_key(|s| s.time_ns);
        let mut pwru = Vec::new();
        let mut after = None;
        loop {
            let page = self.pwru_records(incident, after, MAX_PAGE)?;
            let Some(last) = page.last() else { break };
            after = Some(last.seq);
            pwru.extend(page);
        }
        Ok(IncidentBundle {
            format: "tailtrap-incident/1",
            summary: SampleSummary::of(&samples),
            verdict: self.verdict(inc.id)?,
            incident: inc,
            samples,
            pwru,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_filter_parses_and_reports_the_bad_word() {
        let f: FlowFilter = "dport=443 saddr=10.0.0.5 proto=tcp".parse().unwrap();
        assert_eq!(f.dport, Some(443));
        assert_eq!(f.saddr, Some("10.0.0.5".parse().unwrap()));
        assert_eq!(f.transport, Some(Transport::Tcp));
        assert!("dport=http"
            .parse::<FlowFilter>()
            .unwrap_err()
            .contains("dport"));
        assert!("port=1"
            .parse::<FlowFilter>()
            .unwrap_err()
            .contains("\"port\""));
        assert!("10.0.0.1".parse::<FlowFilter>().is_err());
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        let q = quantiles(&v).unwrap();
        assert_eq!((q.p50, q.p90, q.p99, q.max), (50, 90, 99, 100));
        assert_eq!(quantiles(&[]), None);
        let one = quantiles(&[7]).unwrap();
        assert_eq!((one.p50, one.max), (7, 7));
    }
}
