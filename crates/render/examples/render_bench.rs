//! 50 renders of the ferrol addon chart (docker-ferrol-1-27-v1, with its templated values, as the ClusterAddon
//! controller renders it) with `helm` processes and with the long-lived renderer on Helm's engine: wall time
//! and CPU of each (helm's from the reaped children, the renderer's from `/proc/<pid>/stat`), then the same for
//! the values templating. Tools from `make tools`.
//!
//! `cargo run --release -p cso-render --example render_bench [N]`

use std::{error::Error, path::Path, time::Duration, time::Instant};

use cso_render::{ChartRenderer, Engine, Helm, RenderRequest, ValuesTemplater};
use serde_json::json;

/// Clock ticks per second of `/proc` CPU times (`CLK_TCK`, 100 on Linux).
const TICKS: f64 = 100.0;

/// (user + system) CPU seconds in `/proc/<pid>/stat`: of the process itself (fields 14, 15) and of its reaped
/// children (16, 17).
fn cpu(pid: &str) -> Result<(f64, f64), Box<dyn Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(')').ok_or("no stat")?.1;
    let fields: Vec<f64> = after_name
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // `after_name` starts at field 3 (state): field n is index n - 3.
    let own = (fields.get(11).ok_or("stat")? + fields.get(12).ok_or("stat")?) / TICKS;
    let children = (fields.get(13).ok_or("stat")? + fields.get(14).ok_or("stat")?) / TICKS;
    Ok((own, children))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(50), |a| a.parse())?;
    let tools = cso_testenv::Tools::discover()?;
    let helm_binary = tools.helm.ok_or("helm: run `make tools`")?;
    let renderer = tools.renderer.ok_or("cso-renderer: run `make tools`")?;
    let release =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases/docker-ferrol-1-27-v1");
    let template = std::fs::read_to_string(release.join("cluster-addon-values.yaml"))?;
    let data = json!({"Cluster": {"metadata": {"name": "c1", "namespace": "team-a"},
                                  "spec": {"controlPlaneEndpoint": {"host": "10.1.2.3", "port": 6443}}}});
    let file = release.join("cluster-addon-values.yaml");
    let timeout = Duration::from_secs(120);
    let helm = Helm::new(&helm_binary, timeout)?;
    let engine = Engine::new(&renderer, timeout);
    let values = ValuesTemplater::new(Helm::new(&helm_binary, timeout)?)?
        .render(&file, &template, &data)
        .await?;
    let request = RenderRequest {
        chart: release.join("docker-ferrol-1-27-cluster-addon-v1.tgz"),
        release_name: "cluster-addon".into(),
        namespace: "kube-system".into(),
        values: Some(values),
        kube_version: Some("v1.27.3".into()),
        include_crds: true,
        ..Default::default()
    };
    println!(
        "{n} sequential renders of the ferrol v1 addon chart; {n} values templatings of its values file"
    );

    // helm: a process per render.
    let (_, children_before) = cpu("self")?;
    let started = Instant::now();
    for _ in 0..n {
        helm.render(request.clone()).await?;
    }
    let helm_wall = started.elapsed();
    let (_, children_after) = cpu("self")?;
    println!(
        "helm processes:   {:>8.2?} wall, {:.2} s helm CPU",
        helm_wall,
        children_after - children_before
    );

    // The engine: one process (started and warmed by the first render, which is not counted).
    engine.render(request.clone()).await?;
    let pid = engine
        .process_id()
        .await
        .ok_or("no renderer process")?
        .to_string();
    let (engine_before, _) = cpu(&pid)?;
    let (own_before, _) = cpu("self")?;
    let started = Instant::now();
    for _ in 0..n {
        engine.render(request.clone()).await?;
    }
    let engine_wall = started.elapsed();
    let (engine_after, _) = cpu(&pid)?;
    let (own_after, _) = cpu("self")?;
    println!(
        "engine:           {:>8.2?} wall, {:.2} s renderer CPU, {:.2} s client CPU",
        engine_wall,
        engine_after - engine_before,
        own_after - own_before
    );

    // The engine, all at once.
    let (engine_before, _) = cpu(&pid)?;
    let started = Instant::now();
    let all = (0..n).map(|_| engine.render(request.clone()));
    for result in futures::future::join_all(all).await {
        result?;
    }
    let concurrent_wall = started.elapsed();
    let (engine_after, _) = cpu(&pid)?;
    println!(
        "engine, {n} at once: {:>8.2?} wall, {:.2} s renderer CPU",
        concurrent_wall,
        engine_after - engine_before
    );

    // Values templating.
    let by_helm = ValuesTemplater::new(Helm::new(&helm_binary, timeout)?)?;
    let by_engine = ValuesTemplater::with_engine(engine.clone());
    let (_, children_before) = cpu("self")?;
    let started = Instant::now();
    for _ in 0..n {
        by_helm.render(&file, &template, &data).await?;
    }
    let wall = started.elapsed();
    let (_, children_after) = cpu("self")?;
    println!(
        "values, helm:     {:>8.2?} wall, {:.2} s helm CPU",
        wall,
        children_after - children_before
    );
    let (engine_before, _) = cpu(&pid)?;
    let started = Instant::now();
    for _ in 0..n {
        by_engine.render(&file, &template, &data).await?;
    }
    let wall = started.elapsed();
    let (engine_after, _) = cpu(&pid)?;
    println!(
        "values, engine:   {:>8.2?} wall, {:.2} s renderer CPU",
        wall,
        engine_after - engine_before
    );
    Ok(())
}
