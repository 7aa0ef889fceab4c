//! Claim: with `--auth-token-file`, a node serves only clients that present one of the file's
//! tokens (`authorization: Bearer <token>`); a missing or wrong token is answered
//! `UNAUTHENTICATED` with a clear message and changes nothing. Peer Raft traffic does not use the
//! client token: the cluster forms and replicates without it. The command line takes the token
//! from `BATON_TOKEN` or `--auth-token`.
#![allow(clippy::unwrap_used)]

mod admin_support;

use admin_support::{config, show, Procs};
use baton_rpc::{Client, Error, Security};
use baton_statemachine::Refusal;

const TOKEN: &str = "ops-token-4f1c2a9e7b3d";
const OTHER: &str = "ci-token-0a9b8c7d6e5f";

fn with_token(token: &str) -> Security {
    Security {
        token: Some(token.into()),
        tls: None,
    }
}

fn assert_unauthenticated<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    match result {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, "UNAUTHENTICATED", "{what}: {message}");
            assert!(
                message.contains("token"),
                "{what}: a clear message: {message}"
            );
        }
        other => panic!("{what}: expected UNAUTHENTICATED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_a_listed_token_reach_the_store() {
    let mut procs = Procs::new(with_token(TOKEN)).unwrap();
    let tokens = procs.dir().join("tokens");
    std::fs::write(&tokens, format!("# clients\n{TOKEN}\n{OTHER}\n")).unwrap();
    let args = vec![
        "--auth-token-file".to_string(),
        tokens.display().to_string(),
    ];
    procs.form_cluster(3, &args).await.unwrap();
    // Tokens without TLS protect the client API only, and the node says so.
    for id in 1..=3 {
        assert!(
            procs
                .log(id)
                .contains("client tokens are set but TLS is not"),
            "{}",
            procs.log_tail(id)
        );
    }

    // Both listed tokens work.
    let client = procs.client(with_token(TOKEN)).await.unwrap();
    client.save_if_newer("job", 1, b"one").await.unwrap();
    let other = procs.client(with_token(OTHER)).await.unwrap();
    assert_eq!(other.load("job").await.unwrap().seq, 1);

    // No token, or a wrong one: refused before anything runs.
    let endpoints = procs.endpoints();
    assert_unauthenticated(
        Client::connect_with_security(&endpoints, config(), Security::default())
            .await
            .map(|_| ()),
        "connect without a token",
    );
    let stranger =
        Client::new_with_security(&endpoints, config(), with_token("not-the-token-123456"))
            .unwrap();
    for addr in &endpoints {
        assert_unauthenticated(stranger.node_info(addr).await, "node info, wrong token");
    }
    let anonymous = Client::new(&endpoints, config()).unwrap();
    assert_unauthenticated(
        anonymous.save_if_newer("job", 2, b"intruder").await,
        "write without a token",
    );
    assert_unauthenticated(
        stranger.save_if_newer("sneaky", 1, b"x").await,
        "write with a wrong token",
    );
    let job = client.load("job").await.unwrap();
    assert_eq!(
        (job.seq, job.data.as_slice()),
        (1, &b"one"[..]),
        "nothing changed"
    );
    let sneaky = client.load("sneaky").await;
    assert!(
        matches!(sneaky, Err(Error::Refused(Refusal::NotFound))),
        "nothing changed: {sneaky:?}"
    );

    // Peers replicate without any client token.
    client.save_if_newer("job", 2, b"two").await.unwrap();
    let leader_index = procs
        .info(procs.leader().await.unwrap())
        .await
        .unwrap()
        .applied_index;
    for id in 1..=3 {
        baton_cluster_test::wait::until("replication", admin_support::TIMEOUT, || async {
            let info = procs.info(id).await.map_err(|e| e.to_string())?;
            if info.applied_index >= leader_index {
                Ok(())
            } else {
                Err(format!("node {id} applied {}", info.applied_index))
            }
        })
        .await
        .unwrap();
    }

    // The command line: without a token exit 3 and the reason; with BATON_TOKEN it works.
    let joined = endpoints.join(",");
    let args = [
        "--endpoints",
        joined.as_str(),
        "checkpoint",
        "load",
        "--run",
        "job",
    ];
    let refused = procs.cli(&args).unwrap();
    assert_eq!(refused.status.code(), Some(3), "{}", show(&refused));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("UNAUTHENTICATED"));
    // Nodes that answer, refusing the missing token, are not a cluster that is down: `status`
    // says what they answered (before: "no node answered", also in its JSON).
    let status = procs
        .cli(&["--endpoints", joined.as_str(), "status", "--json"])
        .unwrap();
    assert_eq!(status.status.code(), Some(3), "{}", show(&status));
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains("UNAUTHENTICATED"), "{}", show(&status));
    assert!(!said.contains("no node answered"), "{}", show(&status));
    // `cluster verify` too: a refused token is not an outage to retry (exit 4).
    let verify = procs
        .cli(&["--endpoints", joined.as_str(), "cluster", "verify"])
        .unwrap();
    assert_eq!(verify.status.code(), Some(3), "{}", show(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stderr).contains("UNAUTHENTICATED"),
        "{}",
        show(&verify)
    );
    let allowed = std::process::Command::new(procs.bin())
        .args(args)
        .env("BATON_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(allowed.status.success(), "{}", show(&allowed));
    let mut flagged = vec!["--auth-token", OTHER];
    flagged.extend(args);
    let allowed = procs.cli(&flagged).unwrap();
    assert!(allowed.status.success(), "{}", show(&allowed));

    worker_commands_reach_the_cluster_as_the_worker_does(&procs, &client).await;
}

/// `baton worker run` given its token as a flag: the command it runs for a keyed task fences a
/// write through `baton sink write`, which needs the worker's endpoints and token (passed on in
/// `BATON_ENDPOINTS` / `BATON_TOKEN`) and the task's permit token (`BATON_FENCE`).
async fn worker_commands_reach_the_cluster_as_the_worker_does(procs: &Procs, client: &Client) {
    use baton_statemachine::queue::{TaskSpec, TaskState};
    client.create_queue("t87q", "t87").await.unwrap();
    let task = client
        .submit(&TaskSpec {
            queue: "t87q".into(),
            idempotency_key: "fenced-write".into(),
            handler: "write".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: b"{}".to_vec(),
            concurrency_key: "object/1".into(),
            business_key: String::new(),
            max_attempts: 1,
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
        .task
        .id;
    let script = r#""$0" sink write --resource t87-object --fence "$BATON_FENCE" --value "task-$BATON_TASK_ID""#;
    let joined = procs.endpoints().join(",");
    let mut worker = tokio::process::Command::new(procs.bin())
        .args(["--endpoints", &joined, "--auth-token", TOKEN])
        .args(["worker", "run", "--id", "w87", "--queue", "t87q"])
        .args(["--concurrency-keys", "--", "sh", "-c", script])
        .arg(procs.bin())
        .env_remove("BATON_TOKEN")
        .env_remove("BATON_ENDPOINTS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let done = baton_cluster_test::wait::until("the task ends", admin_support::TIMEOUT, || async {
        let task = client.queue_task(task).await.map_err(|e| e.to_string())?;
        match task.state {
            TaskState::Succeeded | TaskState::Failed => Ok(task),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    worker.start_kill().unwrap();
    let output = worker.wait_with_output().await.unwrap();
    let log = format!(
        "worker stdout: {}\nworker stderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let done = done.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(
        done.state,
        TaskState::Succeeded,
        "{}: {}\n{log}",
        done.last_error,
        String::from_utf8_lossy(&done.result)
    );
    let fence = done.attempts[0].token.unwrap();
    let written = client.read_sink("t87-object").await.unwrap();
    assert_eq!(written.seen_fence, fence, "{log}");
    assert_eq!(written.value, format!("task-{task}").into_bytes(), "{log}");
}
