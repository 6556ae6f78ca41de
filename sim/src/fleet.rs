//! Starting engines: one or many in this process, each with its own HTTP server, KV cache,
//! scheduler, metrics and event publisher.

use std::{net::SocketAddr, sync::Arc};

use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};

use crate::{
    api::{Faults, ServedModel, router},
    engine::{EVENT_QUEUE, EngineConfig, EngineHandle, Vocabulary},
    events::{Publisher, Started},
};
use warmpath_tokenizer::segments::SegmentTokenizer;

/// Everything needed to start one engine.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    pub model: String,
    pub loras: Vec<String>,
    pub max_model_len: usize,
    pub engine: EngineConfig,
    pub faults: Faults,
    pub listen: SocketAddr,
    /// Where and how it publishes KV events, if it does.
    pub events: Option<Publisher>,
}

/// A started engine and where to reach it.
#[derive(Debug)]
pub struct RunningEngine {
    pub http: SocketAddr,
    pub served: Arc<ServedModel>,
    pub server: JoinHandle<()>,
    pub publisher: Option<Started>,
}

impl RunningEngine {
    /// Stops the engine: its HTTP server and event publisher close their sockets, the engine
    /// task ends with its last handle. Like killing a vLLM process.
    pub fn shutdown(self) {
        self.server.abort();
        if let Some(p) = self.publisher {
            p.task.abort();
            p.replay_task.abort();
        }
    }
}

/// Start-up failures, naming the address involved.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Events(#[from] crate::events::PublisherError),
}

/// A response layer that names the engine at `http` ([`crate::api::ENGINE_HEADER`]).
fn engine_header(
    http: SocketAddr,
) -> impl Fn(axum::response::Response) -> std::future::Ready<axum::response::Response> + Clone {
    let value = axum::http::HeaderValue::from_str(&http.to_string())
        .expect("a socket address is a valid header value");
    move |mut response: axum::response::Response| {
        response.headers_mut().insert(
            axum::http::HeaderName::from_static(crate::api::ENGINE_HEADER),
            value.clone(),
        );
        std::future::ready(response)
    }
}

/// Starts one engine on the current runtime.
pub async fn start_engine(
    spec: EngineSpec,
    encoder: Arc<SegmentTokenizer>,
) -> Result<RunningEngine, StartError> {
    let tokenizer = encoder.tokenizer();
    let listener = TcpListener::bind(spec.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: spec.listen,
            source,
        })?;
    let http = listener.local_addr().map_err(|source| StartError::Listen {
        addr: spec.listen,
        source,
    })?;
    let (events_tx, publisher) = match spec.events {
        Some(publisher) => {
            let (tx, rx) = mpsc::channel(EVENT_QUEUE);
            (Some(tx), Some(publisher.start(rx).await?))
        }
        None => (None, None),
    };
    let vocabulary = Vocabulary {
        generation_ids: tokenizer.word_ids().into(),
        eos: tokenizer.eos_id(),
    };
    let seed = spec.engine.seed;
    let engine = EngineHandle::spawn(spec.engine, vocabulary, events_tx);
    let served = Arc::new(ServedModel::new(
        spec.model,
        spec.loras,
        spec.max_model_len,
        encoder.clone(),
        engine,
        spec.faults,
        seed,
    ));
    let app = router(served.clone()).layer(axum::middleware::map_response(engine_header(http)));
    // Small SSE chunks must not wait for delayed ACKs (Nagle).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%err, "TCP_NODELAY");
        }
    });
    let server = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "simulator HTTP server stopped");
        }
    });
    Ok(RunningEngine {
        http,
        served,
        server,
        publisher,
    })
}
