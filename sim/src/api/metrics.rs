//! `GET /metrics`: the engine's statistics in Prometheus text format, under vLLM's metric
//! names, types and labels (`model_name`, `engine`).

use std::{fmt::Write as _, sync::Arc};

use axum::{extract::State, http::header, response::IntoResponse};

use super::ServedModel;
use crate::engine::metrics::Histogram;

pub async fn render(State(s): State<Arc<ServedModel>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render_text(&s),
    )
}

/// The exposition text for one engine.
pub fn render_text(s: &ServedModel) -> String {
    let st = s.engine.stats();
    let cfg = s.engine.config();
    let labels = format!("engine=\"0\",model_name=\"{}\"", escape(&s.name));
    let mut out = String::with_capacity(8 * 1024);
    let mut gauge = |name: &str, help: &str, v: f64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v:?}\n"
        );
    };
    gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        st.running as f64,
    );
    gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        st.waiting as f64,
    );
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        st.kv_usage,
    );
    let counters: [(&str, &str, u64); 6] = [
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_queries,
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            st.prefix_hits,
        ),
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            st.prompt_tokens,
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            st.generation_tokens,
        ),
        (
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            st.preemptions,
        ),
        (
            "vllm:request_aborted",
            "Requests aborted (client disconnected).",
            st.aborted,
        ),
    ];
    for (name, help, v) in counters {
        let _ = write!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {:?}\n",
            v as f64
        );
    }
    let _ = write!(
        out,
        "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{{labels},finished_reason=\"stop\"}} {:?}\n\
         vllm:request_success_total{{{labels},finished_reason=\"length\"}} {:?}\n",
        st.success_stop as f64, st.success_length as f64
    );
    histogram(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &labels,
        &st.ttft,
    );
    histogram(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &labels,
        &st.e2e,
    );
    histogram(
        &mut out,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &labels,
        &st.queue,
    );
    let _ = write!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",\
         gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"0\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\"}} 1.0\n",
        cfg.block_size, cfg.num_gpu_blocks
    );
    if !s.loras.is_empty() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let _ = write!(
            out,
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {now:?}\n",
            s.loras.len(),
            escape(&st.running_loras.join(",")),
            escape(&st.waiting_loras.join(","))
        );
    }
    out
}

fn histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in h.bounds.iter().zip(&h.counts) {
        cumulative += count;
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{bound:?}\"}} {:?}",
            cumulative as f64
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels},le=\"+Inf\"}} {:?}",
        h.count as f64
    );
    let _ = writeln!(out, "{name}_count{{{labels}}} {:?}", h.count as f64);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", h.sum);
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
