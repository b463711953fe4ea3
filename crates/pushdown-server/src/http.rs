//! The server's HTTP port: Prometheus text and the scaling signal.

use std::sync::Arc;

use pushdown_engine::Metrics;

/// Serves `GET /metrics` (Prometheus text) and `GET /scaling` (the scaling signal as JSON,
/// for KEDA's metrics-api scaler or curl) until `shutdown` completes.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::routing::get;
    let scaling = Arc::clone(&metrics);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                }
            }),
        )
        .route(
            "/scaling",
            get(move || {
                let metrics = Arc::clone(&scaling);
                async move {
                    let body = metrics
                        .scaling_signal()
                        .map_or_else(|| "{}".to_owned(), |s| pushdown_engine::scaling_json(&s));
                    ([(axum::http::header::CONTENT_TYPE, "application/json")], body)
                }
            }),
        );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
