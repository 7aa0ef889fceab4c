//! The command layout. Logs written by one version are replayed by the others: a restarted node
//! applies the entries an earlier binary appended after its snapshot, and during a rolling upgrade
//! a follower applies whatever its leader appended. Every entry carries bincode-encoded
//! [`Envelope`]s, and bincode writes fields by position and enum variants by index, with no names:
//! a reordered variant or field still decodes, as something else. This pins the bytes of envelopes
//! that carry every variant of every enum a command holds to the bytes an earlier version wrote
//! for them, and those bytes must read back as the same envelopes.
//!
//! Variants are only ever appended, and so are the envelopes here: a new variant gets an envelope
//! at the end of [`envelopes`] (the matches in [`Seen`] stop compiling until it is numbered there,
//! and a test fails until an envelope carries it). Every image must still be the encoding of the
//! envelopes it was written from, which stay a prefix of the list, and the newest image must cover
//! the whole list. When it does not, the test writes the image of the grown list to a temporary
//! file and names it: it goes to `tests/data/commands-<short commit, or what it adds>.bin` and at
//! the end of [`IMAGES`]. An image is never rewritten.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::board::{self, TaskSpec};
use baton_statemachine::effect::{self, Action, EffectLease, Resolution, RetrySafety};
use baton_statemachine::handoff::{self, OfferArgs, Receipt, ReceiptStatus};
use baton_statemachine::{checkpoint, queue, sink, Command, Envelope, Origin, Stamp};
use serde::de::DeserializeOwned;
use serde::Serialize;

const T0: u64 = 1_800_000_000_000;

/// The images earlier versions wrote of [`envelopes`], oldest first: the commit and its bytes.
const IMAGES: &[(&str, &[u8])] = &[
    ("835c89b", include_bytes!("data/commands-835c89b.bin")),
    (
        "the build adding AdoptRules",
        include_bytes!("data/commands-adopt-rules.bin"),
    ),
];

/// Encodes as the node's codec does (`node/src/codec.rs`).
fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap()
}

/// Decodes as the node's codec does, refusing trailing bytes.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map_err(|error| error.to_string())?;
    if read != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - read));
    }
    Ok(value)
}

/// Wraps each command as a leader would: a distinct stamp per entry, and a client origin on all
/// but every fourth (which the leader proposed itself).
fn stamped(commands: Vec<Command>) -> Vec<Envelope> {
    commands
        .into_iter()
        .zip(1u64..)
        .map(|(command, n)| Envelope {
            stamp: Stamp {
                now_ms: T0 + n * 1_001,
                entropy: u128::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
            },
            origin: (n % 4 != 0).then(|| Origin {
                client_id: 0x5eed_0000_0000_0000 ^ n,
                seq: 1_000 + n,
                acked_below: 900 + n,
            }),
            command,
        })
        .collect()
}

fn handoff(command: handoff::Command) -> Command {
    Command::Handoff(command)
}

fn board(command: board::Command) -> Command {
    Command::Board(command)
}

fn effect(command: effect::Command) -> Command {
    Command::Effect(command)
}

fn queue(command: queue::Command) -> Command {
    Command::Queue(command)
}

fn charge() -> Action {
    Action {
        key: "charge-order-77".into(),
        resource: "ledger/eu".into(),
        safety: RetrySafety::Unsafe,
    }
}

fn email() -> Action {
    Action {
        key: "welcome-mail-5".into(),
        resource: "smtp/out".into(),
        safety: RetrySafety::Safe,
    }
}

fn effect_lease(action: &Action) -> EffectLease {
    EffectLease {
        key: action.key.clone(),
        resource: action.resource.clone(),
        fence: 17,
        holder: "4f1c2a9e0b7d3865a1c4e2f90d8b7a63".into(),
        until_ms: T0 + 42_000,
    }
}

/// The envelopes whose bytes are pinned: every variant of [`Command`] and of every enum its
/// variants hold, with values that differ from their neighbours of the same type, so that swapped
/// fields change the bytes. Append only.
fn envelopes() -> Vec<Envelope> {
    let task = 1_000_001;
    stamped(vec![
        handoff(handoff::Command::Offer(OfferArgs {
            key: "ticket-1".into(),
            from: "planner".into(),
            to: "builder".into(),
            payload: vec![0, 1, 2, 127, 128, 254, 255],
            reply_to: "planner-inbox".into(),
            ttl_ms: 90_000,
        })),
        handoff(handoff::Command::Take {
            key: "ticket-1".into(),
            to: "builder".into(),
        }),
        handoff(handoff::Command::Reply {
            key: "ticket-1".into(),
            token: "0123456789abcdef0123456789abcdef".into(),
            receipt: Receipt {
                status: ReceiptStatus::Done,
                summary: "built and tested".into(),
                failure: String::new(),
                artifacts: vec!["s3://builds/1.tar".into(), "s3://logs/1.txt".into()],
            },
        }),
        handoff(handoff::Command::Reply {
            key: "ticket-2".into(),
            token: "fedcba9876543210fedcba9876543210".into(),
            receipt: Receipt {
                status: ReceiptStatus::Failed,
                summary: String::new(),
                failure: "the compiler crashed".into(),
                artifacts: vec![],
            },
        }),
        handoff(handoff::Command::Reply {
            key: "ticket-3".into(),
            token: "00112233445566778899aabbccddeeff".into(),
            receipt: Receipt {
                status: ReceiptStatus::Refused,
                summary: "not ours".into(),
                failure: "wrong team".into(),
                artifacts: vec!["runbook".into()],
            },
        }),
        handoff(handoff::Command::Cancel {
            key: "ticket-4".into(),
            by: "planner".into(),
        }),
        board(board::Command::Seed(vec![
            TaskSpec {
                id: "fetch".into(),
                deps: vec![],
            },
            TaskSpec {
                id: "build".into(),
                deps: vec!["fetch".into()],
            },
            TaskSpec {
                id: "ship".into(),
                deps: vec!["build".into(), "fetch".into()],
            },
        ])),
        board(board::Command::Claim {
            id: "build".into(),
            agent: "agent-7".into(),
            ttl_ms: 30_000,
        }),
        board(board::Command::Release {
            id: "build".into(),
            token: "release-token".into(),
        }),
        board(board::Command::Complete {
            id: "fetch".into(),
            token: "complete-token".into(),
        }),
        board(board::Command::Renew {
            id: "ship".into(),
            token: "renew-token".into(),
            ttl_ms: 45_000,
        }),
        effect(effect::Command::Acquire {
            action: charge(),
            ttl_ms: 20_000,
        }),
        // Refused when applied (ttl must be > 0), but a refused command is still a log entry.
        effect(effect::Command::Acquire {
            action: email(),
            ttl_ms: -1,
        }),
        effect(effect::Command::Complete {
            action: charge(),
            lease: effect_lease(&charge()),
            result: "charged 5 EUR".into(),
        }),
        effect(effect::Command::Release {
            action: email(),
            lease: effect_lease(&email()),
        }),
        effect(effect::Command::Abandon {
            action: charge(),
            lease: effect_lease(&charge()),
            reason: "worker shutting down".into(),
        }),
        effect(effect::Command::Renew {
            action: email(),
            lease: effect_lease(&email()),
            ttl_ms: 25_000,
        }),
        effect(effect::Command::MarkUncertain {
            action: charge(),
            lease: effect_lease(&charge()),
            reason: "timed out after sending".into(),
        }),
        effect(effect::Command::BeginReconcile {
            action: charge(),
            ttl_ms: 15_000,
        }),
        effect(effect::Command::ResolveUncertain {
            action: charge(),
            resolution: Resolution {
                happened: true,
                result: "found in the ledger".into(),
                force_retryable: false,
            },
        }),
        effect(effect::Command::ResolveUncertain {
            action: email(),
            resolution: Resolution {
                happened: false,
                result: String::new(),
                force_retryable: true,
            },
        }),
        Command::Sink(sink::Command::Write {
            resource: "db/accounts".into(),
            fence: 41,
            value: vec![9, 8, 7],
        }),
        Command::Checkpoint(checkpoint::Command::SaveIfNewer {
            run: "run-9".into(),
            seq: 300,
            data: vec![3, 1, 4, 1, 5],
        }),
        queue(queue::Command::CreateQueue(queue::Queue {
            name: "emails".into(),
            namespace: "tenant-a".into(),
        })),
        queue(queue::Command::RegisterWorker(queue::Worker {
            id: "worker-3".into(),
            concurrency_keys: true,
        })),
        queue(queue::Command::RegisterWorker(queue::Worker {
            id: "worker-4".into(),
            concurrency_keys: false,
        })),
        queue(queue::Command::Submit(queue::TaskSpec {
            queue: "emails".into(),
            idempotency_key: "signup-123".into(),
            handler: "send_welcome".into(),
            handler_version: "2".into(),
            payload_version: "3".into(),
            payload: br#"{"to":"a@example.com"}"#.to_vec(),
            concurrency_key: "user-123".into(),
            business_key: "order-77".into(),
            max_attempts: 5,
            ttl_ms: 3_600_000,
        })),
        queue(queue::Command::Lease {
            worker: "worker-3".into(),
            queues: vec!["emails".into(), "sms".into()],
            limit: 12,
            lease_ttl_ms: 60_000,
        }),
        queue(queue::Command::Start {
            task_id: task,
            attempt: 2,
            worker: "worker-3".into(),
        }),
        queue(queue::Command::Renew {
            task_id: task,
            attempt: 2,
            worker: "worker-3".into(),
            lease_ttl_ms: 61_000,
        }),
        queue(queue::Command::Complete {
            task_id: task,
            attempt: 2,
            worker: "worker-3".into(),
            result: vec![6, 6, 6],
        }),
        queue(queue::Command::Fail {
            task_id: task + 1,
            attempt: 1,
            worker: "worker-4".into(),
            error: "smtp 451".into(),
            retryable: true,
        }),
        queue(queue::Command::Fail {
            task_id: task + 2,
            attempt: 3,
            worker: "worker-4".into(),
            error: "mailbox gone".into(),
            retryable: false,
        }),
        queue(queue::Command::ReportUnknown {
            task_id: task + 3,
            attempt: 4,
            worker: "worker-3".into(),
            note: "connection reset after DATA".into(),
        }),
        queue(queue::Command::Cancel { task_id: task + 4 }),
        Command::Sweep,
        Command::SweepAtMost { expiries: 500 },
        Command::AdoptRules { rules: 1 },
    ])
}

/// The variants the envelopes carry, per enum, as the matches below number them. The matches have
/// no wildcard arms: a new variant stops this file compiling until it is numbered here.
#[derive(Default)]
struct Seen(BTreeMap<&'static str, BTreeSet<u32>>);

impl Seen {
    /// Records that `value`, variant `index` of the enum `name`, is carried, after checking that
    /// bincode writes that index for it.
    fn mark<T: Serialize>(&mut self, name: &'static str, value: &T, index: u32) {
        let written = encode(value)[0];
        assert_eq!(
            u32::from(written),
            index,
            "{name}: the variant numbered {index} here is encoded as variant {written}"
        );
        self.0.entry(name).or_default().insert(index);
    }

    fn variants(&self, name: &str) -> BTreeSet<u32> {
        self.0.get(name).cloned().unwrap_or_default()
    }

    fn envelope(&mut self, envelope: &Envelope) {
        match &envelope.origin {
            None => self.mark("Option<Origin>", &envelope.origin, 0),
            Some(_) => self.mark("Option<Origin>", &envelope.origin, 1),
        }
        self.command(&envelope.command);
    }

    fn command(&mut self, command: &Command) {
        let name = "Command";
        match command {
            Command::Handoff(inner) => {
                self.mark(name, command, 0);
                self.handoff(inner);
            }
            Command::Board(inner) => {
                self.mark(name, command, 1);
                self.board(inner);
            }
            Command::Effect(inner) => {
                self.mark(name, command, 2);
                self.effect(inner);
            }
            Command::Sink(inner) => {
                self.mark(name, command, 3);
                self.sink(inner);
            }
            Command::Checkpoint(inner) => {
                self.mark(name, command, 4);
                self.checkpoint(inner);
            }
            Command::Queue(inner) => {
                self.mark(name, command, 5);
                self.queue(inner);
            }
            Command::Sweep => self.mark(name, command, 6),
            Command::SweepAtMost { .. } => self.mark(name, command, 7),
            Command::AdoptRules { .. } => self.mark(name, command, 8),
        }
    }

    fn handoff(&mut self, command: &handoff::Command) {
        let name = "handoff::Command";
        match command {
            handoff::Command::Offer(_) => self.mark(name, command, 0),
            handoff::Command::Take { .. } => self.mark(name, command, 1),
            handoff::Command::Reply { receipt, .. } => {
                self.mark(name, command, 2);
                self.receipt_status(&receipt.status);
            }
            handoff::Command::Cancel { .. } => self.mark(name, command, 3),
        }
    }

    fn receipt_status(&mut self, status: &ReceiptStatus) {
        let name = "handoff::ReceiptStatus";
        match status {
            ReceiptStatus::Done => self.mark(name, status, 0),
            ReceiptStatus::Failed => self.mark(name, status, 1),
            ReceiptStatus::Refused => self.mark(name, status, 2),
        }
    }

    fn board(&mut self, command: &board::Command) {
        let name = "board::Command";
        match command {
            board::Command::Seed(_) => self.mark(name, command, 0),
            board::Command::Claim { .. } => self.mark(name, command, 1),
            board::Command::Release { .. } => self.mark(name, command, 2),
            board::Command::Complete { .. } => self.mark(name, command, 3),
            board::Command::Renew { .. } => self.mark(name, command, 4),
        }
    }

    fn effect(&mut self, command: &effect::Command) {
        let name = "effect::Command";
        let action = match command {
            effect::Command::Acquire { action, .. } => {
                self.mark(name, command, 0);
                action
            }
            effect::Command::Complete { action, .. } => {
                self.mark(name, command, 1);
                action
            }
            effect::Command::Release { action, .. } => {
                self.mark(name, command, 2);
                action
            }
            effect::Command::Abandon { action, .. } => {
                self.mark(name, command, 3);
                action
            }
            effect::Command::Renew { action, .. } => {
                self.mark(name, command, 4);
                action
            }
            effect::Command::MarkUncertain { action, .. } => {
                self.mark(name, command, 5);
                action
            }
            effect::Command::BeginReconcile { action, .. } => {
                self.mark(name, command, 6);
                action
            }
            effect::Command::ResolveUncertain { action, .. } => {
                self.mark(name, command, 7);
                action
            }
        };
        self.retry_safety(&action.safety);
    }

    fn retry_safety(&mut self, safety: &RetrySafety) {
        let name = "effect::RetrySafety";
        match safety {
            RetrySafety::Safe => self.mark(name, safety, 0),
            RetrySafety::Unsafe => self.mark(name, safety, 1),
        }
    }

    fn sink(&mut self, command: &sink::Command) {
        let name = "sink::Command";
        match command {
            sink::Command::Write { .. } => self.mark(name, command, 0),
        }
    }

    fn checkpoint(&mut self, command: &checkpoint::Command) {
        let name = "checkpoint::Command";
        match command {
            checkpoint::Command::SaveIfNewer { .. } => self.mark(name, command, 0),
        }
    }

    fn queue(&mut self, command: &queue::Command) {
        let name = "queue::Command";
        match command {
            queue::Command::CreateQueue(_) => self.mark(name, command, 0),
            queue::Command::RegisterWorker(_) => self.mark(name, command, 1),
            queue::Command::Submit(_) => self.mark(name, command, 2),
            queue::Command::Lease { .. } => self.mark(name, command, 3),
            queue::Command::Start { .. } => self.mark(name, command, 4),
            queue::Command::Renew { .. } => self.mark(name, command, 5),
            queue::Command::Complete { .. } => self.mark(name, command, 6),
            queue::Command::Fail { .. } => self.mark(name, command, 7),
            queue::Command::ReportUnknown { .. } => self.mark(name, command, 8),
            queue::Command::Cancel { .. } => self.mark(name, command, 9),
        }
    }
}

/// How many variants `T` has as its decoder knows them: the first variant index it refuses as
/// one. (An index it knows fails later, for want of the variant's fields, or decodes.)
fn variant_count<T: DeserializeOwned>() -> u32 {
    (0..=250u8)
        .find(|&index| {
            decode::<T>(&[index]).is_err_and(|error| error.contains("expected variant index"))
        })
        .map(u32::from)
        .expect("no variant index refused")
}

/// Every variant of every enum a command holds is carried by some envelope, numbered as bincode
/// numbers it. A variant added to one of them fails here (once numbered in [`Seen`]) until an
/// envelope carrying it is appended to [`envelopes`].
#[test]
fn every_variant_of_every_command_enum_is_carried() {
    let mut seen = Seen::default();
    for envelope in envelopes() {
        seen.envelope(&envelope);
    }
    let enums = [
        ("Command", variant_count::<Command>()),
        ("handoff::Command", variant_count::<handoff::Command>()),
        ("handoff::ReceiptStatus", variant_count::<ReceiptStatus>()),
        ("board::Command", variant_count::<board::Command>()),
        ("effect::Command", variant_count::<effect::Command>()),
        ("effect::RetrySafety", variant_count::<RetrySafety>()),
        ("sink::Command", variant_count::<sink::Command>()),
        (
            "checkpoint::Command",
            variant_count::<checkpoint::Command>(),
        ),
        ("queue::Command", variant_count::<queue::Command>()),
        ("Option<Origin>", 2),
    ];
    for (name, count) in enums {
        let carried = seen.variants(name);
        let missing: Vec<u32> = (0..count).filter(|i| !carried.contains(i)).collect();
        assert!(
            missing.is_empty(),
            "no envelope carries {name} variant(s) {missing:?}: append one to `envelopes` and \
             write a new image (see the module comment)"
        );
        assert!(
            carried.iter().all(|&i| i < count),
            "{name} has {count} variants but variants {carried:?} are numbered"
        );
    }
}

/// The envelopes must still encode to the bytes earlier versions wrote, and those bytes must read
/// back as the same envelopes. A change that moves, adds or retypes a variant or a field of a
/// command fails here; new variants are appended last, and their envelopes after the pinned ones.
#[test]
fn the_command_layout_is_the_one_earlier_versions_wrote() {
    let envelopes = envelopes();
    for &(commit, image) in IMAGES {
        // The image is the encoded list; its length prefix says how many envelopes it holds.
        let (count, prefix) =
            bincode::serde::decode_from_slice::<u64, _>(image, bincode::config::standard())
                .unwrap();
        let count = count as usize;
        assert!(
            count <= envelopes.len(),
            "the image of {commit} holds {count} envelopes, the list only {}: envelopes are only \
             ever appended",
            envelopes.len()
        );
        let pinned = &envelopes[..count];
        let mut at = prefix;
        for (n, envelope) in pinned.iter().enumerate() {
            let bytes = encode(envelope);
            assert!(
                image.get(at..at + bytes.len()) == Some(&bytes[..]),
                "the command layout changed: envelope {n} ({}) no longer encodes to the bytes \
                 {commit} wrote for it",
                envelope.command.name()
            );
            at += bytes.len();
        }
        assert!(
            encode(pinned) == image,
            "the command layout changed: the envelopes no longer encode to the bytes {commit} wrote"
        );
        let read: Vec<Envelope> = decode(image)
            .unwrap_or_else(|error| panic!("the bytes {commit} wrote no longer decode: {error}"));
        assert!(
            read == pinned,
            "the bytes {commit} wrote no longer read back as the envelopes it wrote them from"
        );
    }
    let (newest, image) = IMAGES.last().unwrap();
    let pinned = decode::<Vec<Envelope>>(image).unwrap().len();
    if pinned != envelopes.len() {
        let candidate = std::env::temp_dir().join("baton-commands-new.bin");
        std::fs::write(&candidate, encode(&envelopes)).unwrap();
        panic!(
            "envelopes past the {pinned} of {newest}'s image are pinned by no image: the image of \
             all {} is in {}; move it to tests/data/commands-<short commit>.bin and append it to \
             IMAGES",
            envelopes.len(),
            candidate.display()
        );
    }
}
