//! A loopback HTTP server for tests: the main package's (`tests/common`) and the stack
//! packages' (`tests/stacks/harness.rs`). Needs only axum and tokio.

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a fresh loopback port; the server stops when the handle drops.
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(app: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Server { addr, task }
}
