//! A [`Sweep`] gives every candidate exactly the incidents of its own replay: one
//! [`Detector`] per candidate fed the same records. Candidates vary every threshold key,
//! including those that split the shared baselines (an incident freezes its candidate's
//! baselines; `max_incident` renews them), on the shipped scenarios.

use std::time::Duration;

use detector::config::Slo;
use detector::replay::{Record, RecordError, Replayer};
use detector::scenario::Scenario;
use detector::sweep::Sweep;
use detector::{Detector, DetectorConfig, Incident, Thresholds};
use model::Probe;

/// The first service's records of a scenario (a sweep replays one service).
fn records(text: &str, name: &str) -> (String, Vec<Record>) {
    let sc = Scenario::from_toml_str(text, name).expect("scenario parses");
    let mut out = Vec::new();
    for interval in sc.generate() {
        out.extend(interval);
    }
    let service = out[0].service.clone();
    out.retain(|r| r.service == service);
    (service, out)
}

fn buckets(r: &Record) -> Vec<(usize, u64)> {
    r.hist.nonzero().collect()
}

fn candidates() -> Vec<Thresholds> {
    let d = Thresholds::default();
    let secs = Duration::from_secs;
    let with = |f: &dyn Fn(&mut Thresholds)| {
        let mut t = d.clone();
        f(&mut t);
        t
    };
    // Each candidate changes keys of different layers (per candidate, baselines, windows),
    // so that few candidates cover every key.
    vec![
        d.clone(),
        with(&|t| {
            t.min_ratio = 1.1;
            t.close_after = 2;
        }),
        with(&|t| {
            t.min_ratio = 3.0;
            t.cooldown = Duration::ZERO;
        }),
        with(&|t| {
            t.min_delta = Duration::ZERO;
            t.open_after = 1;
            t.open_window = 1;
        }),
        with(&|t| {
            t.min_delta = Duration::from_micros(200);
            t.open_after = 6;
            t.open_window = 8;
            t.close_after = 40;
        }),
        with(&|t| {
            t.cooldown = secs(900);
            t.quantiles = vec![0.99];
            t.half_life = secs(600);
        }),
        with(&|t| {
            t.max_incident = secs(90);
            t.quantiles = vec![0.999, 0.5, 0.9];
        }),
        with(&|t| {
            t.window = secs(15);
            t.warmup_time = secs(60);
        }),
        with(&|t| {
            t.min_samples = 20_000;
            t.max_window = secs(120);
            t.warmup_samples = 200_000;
        }),
        // Everything that splits baselines at once.
        with(&|t| {
            t.min_ratio = 1.1;
            t.min_delta = Duration::ZERO;
            t.open_after = 1;
            t.open_window = 1;
            t.close_after = 1;
            t.cooldown = Duration::ZERO;
            t.max_incident = secs(45);
        }),
    ]
}

fn one_by_one(service: &str, recs: &[Record], config: &DetectorConfig) -> Vec<Incident> {
    let mut rp = Replayer::new(Detector::new(config.clone()));
    for r in recs {
        assert_eq!(r.service, service);
        rp.push(r).expect("in order");
    }
    rp.finish().0
}

fn check(name: &str, text: &str, slo: &[Slo]) {
    let (service, recs) = records(text, name);
    let cands = candidates();
    let significance = DetectorConfig::default().significance;
    let mut sweep = Sweep::new(&service, significance, slo, &cands);
    for r in &recs {
        sweep
            .push(r.ts, r.probe, &buckets(r), r.hist.count())
            .expect("in order");
    }
    let groups = sweep.baseline_groups();
    let swept = sweep.finish();
    assert_eq!(swept.len(), cands.len());
    let mut opened = 0;
    for (i, (t, got)) in cands.iter().zip(&swept).enumerate() {
        let config = DetectorConfig {
            significance,
            defaults: t.clone(),
            services: Default::default(),
            slo: slo.to_vec(),
        };
        let want = one_by_one(&service, &recs, &config);
        assert_eq!(got, &want, "{name}: candidate {i} ({t:?})");
        opened += want.len();
    }
    println!(
        "{name}: {} candidates, {opened} incidents, {groups} baseline groups at the end",
        cands.len()
    );
    assert!(
        opened > 0,
        "{name}: the scenario must open incidents to test anything"
    );
}

#[test]
fn a_sweep_equals_one_replay_per_candidate_on_steps() {
    check("steps.toml", include_str!("../scenarios/steps.toml"), &[]);
}

#[test]
fn a_sweep_equals_one_replay_per_candidate_on_bursts() {
    check("bursts.toml", include_str!("../scenarios/bursts.toml"), &[]);
}

#[test]
fn a_sweep_equals_one_replay_per_candidate_on_a_quiet_service() {
    check(
        "low-traffic.toml",
        include_str!("../scenarios/low-traffic.toml"),
        &[],
    );
}

#[test]
fn a_sweep_equals_one_replay_per_candidate_on_stages_with_an_slo() {
    let slo = [Slo {
        service: None,
        probe: Probe::TcpSocketRead,
        quantile: 0.99,
        max: Duration::from_millis(2),
    }];
    check(
        "stages.toml",
        include_str!("../scenarios/stages.toml"),
        &slo,
    );
}

#[test]
fn a_sweep_refuses_records_out_of_order_or_repeated() {
    let (service, recs) = records(include_str!("../scenarios/steps.toml"), "steps.toml");
    let mut sweep = Sweep::new(&service, 1e-4, &[], &[Thresholds::default()]);
    let (a, b) = (&recs[0], &recs[recs.len() - 1]);
    sweep
        .push(b.ts, b.probe, &buckets(b), b.hist.count())
        .unwrap();
    let err = sweep.push(b.ts, b.probe, &buckets(b), b.hist.count());
    assert!(matches!(err, Err(RecordError::Duplicate { .. })), "{err:?}");
    let err = sweep.push(a.ts, a.probe, &buckets(a), a.hist.count());
    assert!(
        matches!(err, Err(RecordError::OutOfOrder { .. })),
        "{err:?}"
    );
    assert_eq!(sweep.finish(), vec![Vec::<Incident>::new()]);
}
