//! Scraping each endpoint's `/metrics` every 200 ms: waiting and running requests and KV usage,
//! so load the proxy did not create itself (other agents, direct clients) enters decisions.
//! Between scrapes the proxy's own in-flight accounting keeps the picture current.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

use super::Proxy;

/// How often each endpoint is scraped.
pub const SCRAPE_INTERVAL: Duration = Duration::from_millis(200);
/// A scrape slower than this is skipped (the previous numbers stay).
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest metrics page read.
const MAX_PAGE: usize = 4 * 1024 * 1024;

/// Every this many scrapes, each endpoint's `/v1/models` is read again (LoRA adapters served).
const MODELS_EVERY: u64 = 25;

/// Scrapes every endpoint forever (until the task is aborted).
pub async fn scrape_loop(proxy: Arc<Proxy>) {
    let mut tick = tokio::time::interval(SCRAPE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for round in 0u64.. {
        tick.tick().await;
        let all: Vec<_> = proxy
            .pools
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.pool
                    .endpoints()
                    .iter()
                    .map(|e| (i, p.pool.model.clone(), e.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let scrapes = all.into_iter().map(|(pool, model, e)| {
            let proxy = proxy.clone();
            async move {
                let was_healthy = e.scrape_healthy();
                match tokio::time::timeout(SCRAPE_TIMEOUT, fetch(&proxy, &e.metrics_url)).await {
                    Ok(Some(page)) => {
                        match parse_load(&page) {
                            Some((waiting, running, kv)) => e.set_engine_load(waiting, running, kv),
                            None => e.note_scrape_failure(),
                        }
                        if let Some(blocks) = parse_kv_blocks(&page) {
                            e.set_kv_capacity(blocks);
                        }
                        if let Some((running, waiting)) = parse_lora(&page) {
                            e.set_adapter_activity(running, waiting);
                        }
                    }
                    _ => {
                        e.note_scrape_failure();
                        tracing::debug!(endpoint = %e.authority, "metrics scrape failed");
                    }
                }
                if e.scrape_healthy() != was_healthy
                    && let Some(p) = proxy.pools.get(pool)
                {
                    // Ready or unready for the kernel table: its writer wakes now.
                    p.pool.note_change();
                }
                if round % MODELS_EVERY == 0
                    && let Ok(Some(page)) = tokio::time::timeout(
                        SCRAPE_TIMEOUT,
                        fetch(&proxy, &format!("http://{}/v1/models", e.authority)),
                    )
                    .await
                    && let Some(adapters) = parse_adapters(&page, &model)
                {
                    e.set_served_adapters(adapters);
                }
            }
        });
        futures::future::join_all(scrapes).await;
    }
}

/// LoRA adapter cards (`parent` == the base model) of a `/v1/models` answer.
pub fn parse_adapters(page: &str, base: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(page).ok()?;
    let mut out: Vec<String> = v["data"]
        .as_array()?
        .iter()
        .filter(|m| m["parent"].as_str() == Some(base))
        .filter_map(|m| m["id"].as_str().map(str::to_string))
        .collect();
    out.sort();
    Some(out)
}

/// (running, waiting) adapters from the newest `vllm:lora_requests_info` series (its value is
/// a timestamp; vLLM leaves older label sets behind).
pub fn parse_lora(page: &str) -> Option<(Vec<String>, Vec<String>)> {
    const NAME: &str = "vllm:lora_requests_info{";
    let newest = page
        .lines()
        .filter(|l| l.starts_with(NAME))
        .filter_map(|l| {
            let (labels, value) = l[NAME.len()..].rsplit_once("} ")?;
            Some((value.trim().parse::<f64>().ok()?, labels))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))?
        .1;
    let label = |key: &str| -> Vec<String> {
        let pat = format!("{key}=\"");
        newest
            .find(&pat)
            .map(|i| &newest[i + pat.len()..])
            .and_then(|rest| rest.split_once('"'))
            .map(|(v, _)| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    Some((
        label("running_lora_adapters"),
        label("waiting_lora_adapters"),
    ))
}

/// The engine's KV cache size in blocks: the `num_gpu_blocks` label of
/// `vllm:cache_config_info` (first series; `None` without one, or a size of 0).
pub fn parse_kv_blocks(page: &str) -> Option<u64> {
    const NAME: &str = "vllm:cache_config_info{";
    let line = page.lines().find(|l| l.starts_with(NAME))?;
    let labels = &line[NAME.len()..line.rfind('}')?];
    const KEY: &str = "num_gpu_blocks=\"";
    let at = labels
        .match_indices(KEY)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || labels.as_bytes()[i - 1] == b',')?;
    let rest = &labels[at + KEY.len()..];
    let value = rest.split_once('"')?.0;
    value.parse::<u64>().ok().filter(|b| *b > 0)
}

/// Scrapes speak HTTP/1.1 whatever the pool uses: metrics pages may be served apart from the API.
async fn fetch(proxy: &Proxy, url: &str) -> Option<String> {
    let req = http::Request::get(url).body(Full::new(Bytes::new())).ok()?;
    let resp = proxy
        .upstreams
        .client(crate::pool::UpstreamProtocol::Http1)
        .request(req)
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = Limited::new(resp.into_body(), MAX_PAGE)
        .collect()
        .await
        .ok()?
        .to_bytes();
    String::from_utf8(body.to_vec()).ok()
}

/// (waiting, running, KV usage) from a vLLM metrics page (first series of each name).
pub fn parse_load(page: &str) -> Option<(u32, u32, f64)> {
    let value = |name: &str| -> Option<f64> {
        page.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let waiting = value("vllm:num_requests_waiting")?;
    let running = value("vllm:num_requests_running")?;
    let kv = value("vllm:kv_cache_usage_perc")
        .or_else(|| value("vllm:gpu_cache_usage_perc"))
        .unwrap_or(0.0);
    Some((
        waiting.min(f64::from(u32::MAX)) as u32,
        running.min(f64::from(u32::MAX)) as u32,
        kv,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_gauges_and_rejects_pages_without_them() {
        let page = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
                    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 12.0\n\
                    vllm:num_requests_waiting_by_reason{reason=\"x\"} 99\n\
                    vllm:gpu_cache_usage_perc{engine=\"0\"} 0.25\n";
        assert_eq!(parse_load(page), Some((12, 3, 0.25)));
        assert_eq!(parse_load("garbage\n"), None);
        assert_eq!(
            parse_load("vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\n"),
            None
        );
    }

    #[test]
    fn reads_the_kv_cache_size_from_cache_config_info() {
        // vLLM's own series (labels sorted), as the simulator writes it too.
        let page = "# TYPE vllm:cache_config_info gauge\n\
                    vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",num_cpu_blocks=\"0\",num_gpu_blocks=\"1200\"} 1.0\n";
        assert_eq!(parse_kv_blocks(page), Some(1200));
        // num_cpu_blocks is not num_gpu_blocks; a missing, zero or garbled size is no size.
        assert_eq!(
            parse_kv_blocks("vllm:cache_config_info{num_cpu_blocks=\"7\"} 1\n"),
            None
        );
        assert_eq!(
            parse_kv_blocks("vllm:cache_config_info{num_gpu_blocks=\"0\"} 1\n"),
            None
        );
        assert_eq!(
            parse_kv_blocks("vllm:cache_config_info{num_gpu_blocks=\"-3\"} 1\n"),
            None
        );
        assert_eq!(
            parse_kv_blocks("vllm:cache_config_info{num_gpu_blocks=\"9"),
            None
        );
        assert_eq!(parse_kv_blocks("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn reads_the_newest_lora_series_and_adapter_cards() {
        let page = "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 1.7e9\n\
                    vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"math\"} 1.8e9\n";
        assert_eq!(
            parse_lora(page),
            Some((vec!["sql".into(), "chat".into()], vec!["math".into()]))
        );
        assert_eq!(parse_lora("vllm:num_requests_running 1\n"), None);
        let models = r#"{"object":"list","data":[{"id":"base","parent":null},{"id":"sql","parent":"base"},{"id":"x","parent":"other"}]}"#;
        assert_eq!(
            parse_adapters(models, "base"),
            Some(vec!["sql".to_string()])
        );
        assert_eq!(parse_adapters("nope", "base"), None);
    }
}
