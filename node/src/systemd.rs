//! Readiness for systemd (`Type=notify`): `READY=1` once the node serves, `STOPPING=1` when it
//! begins to shut down. Both do nothing unless systemd set `NOTIFY_SOCKET`.

use sd_notify::NotifyState;

/// Tells systemd the node serves.
pub fn ready() {
    notify(NotifyState::Ready);
}

/// Tells systemd the node is shutting down.
pub fn stopping() {
    notify(NotifyState::Stopping);
}

fn notify(state: NotifyState) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}
