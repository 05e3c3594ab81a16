//! History as the CLI reads it, dense or sparse, over a service's time range (`history`,
//! `tune`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use detector::replay::Record;
use model::Probe;
use storage::{SparseSeries, Store};

use crate::api::query::{self, HistoryParams};
use crate::api::HistoryAnswer;
use crate::cmd::shared::since::parse_since;
use crate::output::fmt_time;
use crate::source::Source;

/// Where the history to read lies: a service, a time range and a resolution. Shared with
/// `tailtrap tune`.
#[derive(clap::Args, Debug, Clone)]
pub struct Range {
    /// The service, as named in the daemon's configuration.
    pub service: String,
    /// From this long ago (`6h`, `7d`) or this RFC 3339 time, until now (or `--to`).
    #[arg(long, value_parser = parse_since, conflicts_with = "from")]
    pub since: Option<u64>,
    /// Start of the range: an RFC 3339 time (or a span back from now).
    #[arg(long, value_parser = parse_since)]
    pub from: Option<u64>,
    /// End of the range: an RFC 3339 time (or a span back from now); default now.
    #[arg(long, value_parser = parse_since)]
    pub to: Option<u64>,
    /// The stored resolution to read: `1s`, `10s` or `1m` (default: the finest whose
    /// retention reaches the start of the range).
    #[arg(long, value_parser = parse_resolution)]
    pub resolution: Option<Duration>,
}

/// `1s`, `10s`, `1m`: a positive span.
fn parse_resolution(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    if d.is_zero() {
        return Err("the resolution must be positive".into());
    }
    Ok(d)
}

impl Range {
    /// The API parameters for this range, `probe` optional.
    pub fn params(&self, probe: Option<Probe>, default_span: Duration) -> HistoryParams {
        let now = model::unix_ns(SystemTime::now());
        let span = u64::try_from(default_span.as_nanos()).unwrap_or(u64::MAX);
        HistoryParams {
            service: self.service.clone(),
            probe,
            from_ns: self
                .since
                .or(self.from)
                .unwrap_or_else(|| now.saturating_sub(span)),
            to_ns: self.to.unwrap_or(now),
            resolution_ms: self
                .resolution
                .map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

/// The history as replay records: every probe's points, ordered by time then probe. A
/// point stored under its start becomes a record stamped with its end, as the daemon's
/// detector saw it.
pub fn records(h: HistoryAnswer) -> Vec<Record> {
    let interval_ms = u64::try_from(h.resolution.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let HistoryAnswer {
        service,
        resolution,
        series,
        ..
    } = h;
    // Histograms are moved, not copied: a week of points is hundreds of megabytes dense.
    let mut out: Vec<Record> = series
        .into_iter()
        .flat_map(|s| {
            let service = service.clone();
            s.points.into_iter().map(move |(start, hist)| Record {
                ts: UNIX_EPOCH + Duration::from_nanos(start) + resolution,
                service: service.clone(),
                probe: s.probe,
                interval_ms,
                hist,
            })
        })
        .collect();
    out.sort_by(|a, b| a.ts.cmp(&b.ts).then(a.probe.cmp(&b.probe)));
    out
}

/// Read the history `params` names, refusing an answer without a single point.
pub async fn read(source: &Source, params: &HistoryParams) -> anyhow::Result<HistoryAnswer> {
    let h = source.history(params).await?;
    if h.series.is_empty() {
        bail!(
            "no history for {:?} between {} and {} at {} resolution",
            h.service,
            fmt_time(h.from_ns),
            fmt_time(h.to_ns),
            humantime::format_duration(h.resolution)
        );
    }
    Ok(h)
}

/// One service's history for a replay: every probe's points, sparse, in replay order
/// (what `tailtrap tune` reads). A database opened here is read slice by slice straight
/// from its chunks, into buffers reused (a week of seven probes' points held at once is
/// hundreds of megabytes even sparse); a daemon's answer is converted once.
pub struct SparseHistory {
    /// The service.
    pub service: String,
    /// Width of each point.
    pub resolution: Duration,
    /// The range asked for, ns since the epoch (inclusive).
    pub from_ns: u64,
    /// End of the range.
    pub to_ns: u64,
    /// Probes with history at the level read, in probe order.
    pub probes: Vec<Probe>,
    points: Points,
}

enum Points {
    /// Every point, loaded (only probes with points).
    Loaded(Vec<(Probe, SparseSeries)>),
    /// Read from the database when replayed.
    Db { store: Box<Store>, level: usize },
}

/// Points per probe in one slice of a database read.
const SLICE_POINTS: u64 = 2160;

impl SparseHistory {
    /// Every point, ordered as [`records`] orders them (by time, then probe):
    /// `f(start ns, probe, series, index)`.
    pub fn for_each(
        &self,
        mut f: impl FnMut(u64, Probe, &SparseSeries, usize),
    ) -> anyhow::Result<()> {
        match &self.points {
            Points::Loaded(series) => merge(series, &mut f),
            Points::Db { store, level } => {
                let res = u64::try_from(self.resolution.as_nanos())
                    .unwrap_or(u64::MAX)
                    .max(1);
                // Slices end on multiples of a whole number of chunks (60 points), so each
                // chunk is decoded once.
                let span = res.saturating_mul(SLICE_POINTS);
                let mut series: Vec<(Probe, SparseSeries)> = self
                    .probes
                    .iter()
                    .map(|&p| (p, SparseSeries::new()))
                    .collect();
                let mut since = self.from_ns;
                loop {
                    let next = (since / span).saturating_add(1).saturating_mul(span);
                    let until = next.saturating_sub(1).min(self.to_ns);
                    for (probe, s) in &mut series {
                        store.history_sparse_into(
                            *level,
                            &self.service,
                            *probe,
                            since,
                            until,
                            s,
                        )?;
                    }
                    merge(&series, &mut f);
                    if until >= self.to_ns {
                        break;
                    }
                    since = next;
                }
            }
        }
        Ok(())
    }
}

/// The points of `series` by time, then probe (a handful of probes: a scan finds the
/// earliest next point).
fn merge(series: &[(Probe, SparseSeries)], f: &mut impl FnMut(u64, Probe, &SparseSeries, usize)) {
    let mut next = vec![0usize; series.len()];
    loop {
        let mut best: Option<(usize, u64)> = None;
        for (k, (_, s)) in series.iter().enumerate() {
            if next[k] < s.len() {
                let t = s.start(next[k]);
                if best.is_none_or(|(_, bt)| t < bt) {
                    best = Some((k, t));
                }
            }
        }
        let Some((k, t)) = best else { return };
        let (probe, s) = &series[k];
        f(t, *probe, s, next[k]);
        next[k] += 1;
    }
}

impl From<HistoryAnswer> for SparseHistory {
    fn from(h: HistoryAnswer) -> Self {
        let series: Vec<(Probe, SparseSeries)> = h
            .series
            .into_iter()
            .map(|s| {
                let mut out = SparseSeries::new();
                for (t, hist) in &s.points {
                    out.push_histogram(*t, hist);
                }
                (s.probe, out)
            })
            .collect();
        SparseHistory {
            service: h.service,
            resolution: h.resolution,
            from_ns: h.from_ns,
            to_ns: h.to_ns,
            probes: series.iter().map(|(p, _)| *p).collect(),
            points: Points::Loaded(series),
        }
    }
}

/// [`read`] for a replay. A database opened here is read when replayed; a daemon's answer
/// is read now. A range without a single point is found replaying it: [`no_history`] is
/// then the error [`read`] gives.
pub async fn read_sparse(source: Source, params: &HistoryParams) -> anyhow::Result<SparseHistory> {
    let store = match source {
        Source::Db(store) => store,
        api => return Ok(read(&api, params).await?.into()),
    };
    let now = model::unix_ns(SystemTime::now());
    let plan = query::history_plan(&store, params, now)?;
    let resolution = store
        .config()
        .history
        .get(plan.level)
        .map_or(Duration::ZERO, |l| l.resolution);
    let h = SparseHistory {
        service: params.service.clone(),
        resolution,
        from_ns: params.from_ns,
        to_ns: plan.to_ns,
        probes: plan.probes,
        points: Points::Db {
            store,
            level: plan.level,
        },
    };
    Ok(h)
}

/// The error [`read`] gives for a range without a single point.
pub fn no_history(h: &SparseHistory) -> anyhow::Error {
    anyhow::anyhow!(
        "no history for {:?} between {} and {} at {} resolution",
        h.service,
        fmt_time(h.from_ns),
        fmt_time(h.to_ns),
        humantime::format_duration(h.resolution)
    )
}
