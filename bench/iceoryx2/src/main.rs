//! icebench - iceoryx2 beside smclo in the native API's benchmark rows
//! (bench/api.py runs it exactly as it runs bench/apibench.c).
//!
//!   icebench serve  NAME TEST SIZE           print "ready", serve until the client is done
//!   icebench client NAME TEST SIZE SECONDS   print one JSON line
//!
//! NAME prefixes the iceoryx2 services of one run (bench/api.py makes it
//! unique).  Messages are iceoryx2 publish-subscribe samples of [u8], loaned
//! from the publisher's shared memory (loan_slice_uninit), written there in
//! place and read there in place: zero copy.  TEST:
//!
//!   bulk           the client publishes SIZE-byte messages on NAME.data for
//!                  SECONDS, writing every byte; the server reads every byte
//!                  (the same sum of bytes as apibench) and at the end, marked
//!                  by an empty message, publishes its totals on NAME.result;
//!                  the rate is bytes/s.  The publisher blocks while the
//!                  subscriber's queue is full (RetryUntilDelivered): nothing
//!                  may be dropped
//!   pingpong       SIZE bytes on NAME.ping, the answer on NAME.pong, one at
//!                  a time, both ends busy-polling their subscriber (as
//!                  iceoryx2's own benchmarks do, but yielding the CPU between
//!                  polls: see pause()): the round trip's median and 99th
//!                  percentile in microseconds
//!   pingpong-wait  the same, but each side sleeps in an iceoryx2 listener
//!                  (event services NAME.ping-ev, NAME.pong-ev) until the
//!                  other's notifier wakes it, as an event-driven program
//!                  would (the sockets' rows block in the kernel too)
//!   pingpong-spin  iceoryx2 at its best, as its own benchmarks run it: a
//!                  pure spin between polls (no yield) and the next sample
//!                  loaned ahead, while the answer is on its way; every
//!                  byte still written and summed
//!   reference      iceoryx2's own publish-subscribe benchmark's method, in
//!                  one process: two threads, each pinned to its CPU (0 and
//!                  1), a pure spin, the initiator's next sample loaned
//!                  ahead, the payload neither written nor read; the mean
//!                  round trip (that benchmark prints half of it as its
//!                  latency).  The server side only says "ready"
//!
//! The server checks nothing itself: the client compares the server's byte
//! count and sum with its own (bulk) or each answer's length and byte sum
//! with what they must be (pingpong), and says "ok": false on any difference.

use core::mem::MaybeUninit;
use std::time::{Duration, Instant};

use iceoryx2::port::LoanError;
use iceoryx2::prelude::*;

type Error = Box<dyn core::error::Error>;
type Bytes =
    iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, [u8], ()>;
type Publisher = iceoryx2::port::publisher::Publisher<ipc::Service, [u8], ()>;
type Subscriber = iceoryx2::port::subscriber::Subscriber<ipc::Service, [u8], ()>;

/// What the bulk server publishes at the end: everything it read.
#[derive(Debug, Default, Clone, Copy, ZeroCopySend)]
#[repr(C)]
struct Totals {
    bytes: u64,
    msgs: u64,
    sum: u64,
}

/// Sum of the bytes of `p`: the reader touches every byte it gets.  The same
/// as apibench's sum_bytes: on x86-64 SSE2's sum of absolute differences
/// against zero, 16 bytes at a time (so that the rows measure the transfer,
/// not the summing); elsewhere eight at a time, the byte pairs of a word
/// added in four 16-bit lanes, one multiplication adding the lanes.
#[cfg(target_arch = "x86_64")]
fn sum_bytes(p: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut chunks = p.chunks_exact(64);
    // SAFETY: SSE2 is part of x86-64; every load is of 16 bytes inside `p`
    // (unaligned loads).
    let s = unsafe {
        let zero = _mm_setzero_si128();
        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
        for c in &mut chunks {
            let q = c.as_ptr() as *const __m128i;
            a0 = _mm_add_epi64(a0, _mm_sad_epu8(_mm_loadu_si128(q), zero));
            a1 = _mm_add_epi64(a1, _mm_sad_epu8(_mm_loadu_si128(q.add(1)), zero));
            a2 = _mm_add_epi64(a2, _mm_sad_epu8(_mm_loadu_si128(q.add(2)), zero));
            a3 = _mm_add_epi64(a3, _mm_sad_epu8(_mm_loadu_si128(q.add(3)), zero));
        }
        let a = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
        _mm_cvtsi128_si64(a) as u64 + _mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a)) as u64
    };
    s + chunks.remainder().iter().map(|&b| b as u64).sum::<u64>()
}

#[cfg(not(target_arch = "x86_64"))]
fn sum_bytes(p: &[u8]) -> u64 {
    const M: u64 = 0x00ff00ff00ff00ff;
    let mut s = 0u64;
    let mut words = p.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap());
        let t = (w & M) + ((w >> 8) & M);
        s += t.wrapping_mul(0x0001000100010001) >> 48;
    }
    s + words.remainder().iter().map(|&b| b as u64).sum::<u64>()
}

fn service_name(name: &str, what: &str) -> Result<ServiceName, Error> {
    Ok(ServiceName::new(&format!("{name}.{what}"))?)
}

/// A stream of byte slices from one publisher to one subscriber.  `depth`
/// is the subscriber's queue; the publisher waits when it is full.
fn bytes_service(
    node: &Node<ipc::Service>,
    name: &ServiceName,
    depth: usize,
    create: bool,
) -> Result<Bytes, Error> {
    let b = node
        .service_builder(name)
        .publish_subscribe::<[u8]>()
        .max_publishers(1)
        .max_subscribers(1)
        .history_size(0)
        .subscriber_max_buffer_size(depth)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false);
    Ok(if create { b.create()? } else { b.open()? })
}

/// A publisher of messages up to `size` bytes: the data segment holds
/// samples of that length (the service's max slice length).
fn publisher(svc: &Bytes, size: usize) -> Result<Publisher, Error> {
    Ok(svc
        .publisher_builder()
        .initial_max_slice_len(size)
        .max_loaned_samples(1)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()?)
}

/// Loan `n` bytes, fill every one with `v`, send.  A loan fails while every
/// sample of the data segment is still queued or held by the subscriber:
/// then try again (a yield, as the other side has the data to read).
fn put(publ: &Publisher, v: u8, n: usize) -> Result<(), Error> {
    fill_send(loan(publ, n)?, v)
}

type Loaned = iceoryx2::sample_mut_uninit::SampleMutUninit<ipc::Service, [MaybeUninit<u8>], ()>;

/// A sample of `n` bytes, waiting while none is free.
fn loan(publ: &Publisher, n: usize) -> Result<Loaned, Error> {
    loop {
        match publ.loan_slice_uninit(n) {
            Ok(s) => return Ok(s),
            Err(LoanError::OutOfMemory) | Err(LoanError::ExceedsMaxLoans) => pause(),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Fill every byte of a loaned sample with `v` and send it.
fn fill_send(mut sample: Loaned, v: u8) -> Result<(), Error> {
    sample.payload_mut().fill(MaybeUninit::new(v));
    unsafe { sample.assume_init() }.send()?;
    Ok(())
}

/// Keep the server's ports until the client has closed its subscriber
/// (at most 10 s): its last sample must stay readable until then.
/// `subscribers` counts the subscribers of the service the server published on.
fn linger(subscribers: impl Fn() -> usize) {
    let t0 = Instant::now();
    while subscribers() > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Between two polls of an empty subscriber: let the other programs run.
/// iceoryx2's own benchmarks spin without yielding, one CPU pinned per side.
/// Unpinned on 2 CPUs, a pure spin that shares its CPU with the peer holds
/// it until the scheduler's tick: a ping-pong round trip took 8 ms that way
/// here (3 us when the two sides happened to be on different CPUs), against
/// 3-5 us either way with the yield, which returns at once when nothing
/// else is waiting for the CPU.
fn pause() {
    std::thread::yield_now();
}

// ---- bulk ---------------------------------------------------------------

const DEPTH: usize = 4; // bulk: messages queued at most before the publisher waits

/// The bulk server; `_size` is not needed: the client's publisher sets the
/// slice length of its data segment.
fn serve_bulk(node: &Node<ipc::Service>, name: &str, _size: usize) -> Result<(), Error> {
    let data = bytes_service(node, &service_name(name, "data")?, DEPTH, true)?;
    let result = node
        .service_builder(&service_name(name, "result")?)
        .publish_subscribe::<Totals>()
        .max_publishers(1)
        .max_subscribers(1)
        .create()?;
    let sub = data.subscriber_builder().create()?;
    let out = result.publisher_builder().create()?;
    println!("ready");

    let mut t = Totals::default();
    let mut started = false;
    loop {
        // busy polling, as iceoryx2's own benchmarks do
        let Some(s) = sub.receive()? else {
            pause();
            continue;
        };
        if s.payload().is_empty() {
            if started {
                break; // the client's end mark
            }
            // the client's hello: our subscriber is connected now, tell it
            started = true;
            out.send_copy(Totals::default())?;
            continue;
        }
        t.sum += sum_bytes(s.payload());
        t.bytes += s.payload().len() as u64;
        t.msgs += 1;
    }
    out.send_copy(t)?;
    linger(|| result.dynamic_config().number_of_subscribers());
    Ok(())
}

/// The server's next message on NAME.result.
fn answer_of(
    answer: &iceoryx2::port::subscriber::Subscriber<ipc::Service, Totals, ()>,
) -> Result<Totals, Error> {
    loop {
        if let Some(s) = answer.receive()? {
            return Ok(*s.payload());
        }
        pause();
    }
}

fn client_bulk(node: &Node<ipc::Service>, name: &str, size: usize, secs: f64) -> Result<(), Error> {
    let data = bytes_service(node, &service_name(name, "data")?, DEPTH, false)?;
    let result = node
        .service_builder(&service_name(name, "result")?)
        .publish_subscribe::<Totals>()
        .open()?;
    let answer = result.subscriber_builder().create()?;
    let publ = publisher(&data, size)?;

    // A publisher whose subscriber has not attached to the connection yet
    // drops what no longer fits the queue (iceoryx2 will not block for a
    // receiver that may never come): say hello, and start once the server
    // has answered it.
    put(&publ, 0, 0)?;
    answer_of(&answer)?;

    let mut mine = Totals::default();
    let mut v = 0u8;
    let t0 = Instant::now();
    loop {
        for _ in 0..64 {
            put(&publ, v, size)?;
            mine.sum += v as u64 * size as u64;
            mine.bytes += size as u64;
            mine.msgs += 1;
            v = v.wrapping_add(1);
        }
        if t0.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    put(&publ, 0, 0)?; // the end mark: an empty message, behind all the others
    let theirs = answer_of(&answer)?;
    let t1 = t0.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\": {}, \"msgs\": {}, \"seconds\": {:.4}, \"ok\": {}}}",
        theirs.bytes,
        theirs.msgs,
        t1,
        theirs.bytes == mine.bytes && theirs.sum == mine.sum && theirs.msgs == mine.msgs
    );
    Ok(())
}

// ---- ping-pong ------------------------------------------------------------

/// How a ping-pong side waits for the next message: busy polling its
/// subscriber, or asleep in a listener until the peer's notifier wakes it.
struct Waiter {
    notifier: Option<iceoryx2::port::notifier::Notifier<ipc::Service>>,
    listener: Option<iceoryx2::port::listener::Listener<ipc::Service>>,
    spin: bool, // between polls: a pure spin, not a yield (pingpong-spin)
}

/// How a ping-pong waits and loans: from its TEST.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Yield, // pingpong: poll, yield between polls, loan when sending
    Wait,  // pingpong-wait: sleep in a listener
    Spin,  // pingpong-spin: poll in a pure spin, the next sample loaned ahead
}

impl Waiter {
    /// `wait`: the event services NAME.<mine>-ev (listened to) and
    /// NAME.<theirs>-ev (notified); the server creates them, the client opens.
    fn new(
        node: &Node<ipc::Service>,
        name: &str,
        mode: Mode,
        mine: &str,
        theirs: &str,
        create: bool,
    ) -> Result<Waiter, Error> {
        if mode != Mode::Wait {
            return Ok(Waiter {
                notifier: None,
                listener: None,
                spin: mode == Mode::Spin,
            });
        }
        let event = |what: &str| -> Result<_, Error> {
            let b = node.service_builder(&service_name(name, what)?).event();
            Ok(if create { b.create()? } else { b.open()? })
        };
        let listener = event(&format!("{mine}-ev"))?.listener_builder().create()?;
        let notifier = event(&format!("{theirs}-ev"))?
            .notifier_builder()
            .create()?;
        Ok(Waiter {
            notifier: Some(notifier),
            listener: Some(listener),
            spin: false,
        })
    }

    /// Tell the peer a message was sent (waiting side only).
    fn sent(&self) -> Result<(), Error> {
        if let Some(n) = &self.notifier {
            n.notify()?;
        }
        Ok(())
    }

    /// The next message of `sub`, waiting for it as chosen.
    fn next(
        &self,
        sub: &Subscriber,
    ) -> Result<iceoryx2::sample::Sample<ipc::Service, [u8], ()>, Error> {
        loop {
            if let Some(s) = sub.receive()? {
                return Ok(s);
            }
            match &self.listener {
                // a notification that came before we sleep wakes us at once
                Some(l) => {
                    l.blocking_wait(|_| {})?;
                }
                None if self.spin => core::hint::spin_loop(),
                None => pause(),
            }
        }
    }
}

/// The server answers each ping with SIZE bytes of the ping's byte sum (as
/// a byte); an empty ping ends it.
fn serve_pingpong(
    node: &Node<ipc::Service>,
    name: &str,
    size: usize,
    mode: Mode,
) -> Result<(), Error> {
    let ping = bytes_service(node, &service_name(name, "ping")?, 1, true)?;
    let pong = bytes_service(node, &service_name(name, "pong")?, 1, true)?;
    let w = Waiter::new(node, name, mode, "ping", "pong", true)?;
    let sub = ping.subscriber_builder().create()?;
    let publ = publisher(&pong, size)?;
    println!("ready");

    loop {
        // loaned ahead: the answer's sample is ready before the ping comes
        let ahead = if mode == Mode::Spin { Some(loan(&publ, size)?) } else { None };
        let s = w.next(&sub)?;
        if s.payload().is_empty() {
            break;
        }
        let v = sum_bytes(s.payload()) as u8;
        drop(s); // back to the client's data segment before answering
        match ahead {
            Some(sample) => fill_send(sample, v)?,
            None => put(&publ, v, size)?,
        }
        w.sent()?;
    }
    linger(|| pong.dynamic_config().number_of_subscribers());
    Ok(())
}

fn client_pingpong(
    node: &Node<ipc::Service>,
    name: &str,
    size: usize,
    secs: f64,
    mode: Mode,
) -> Result<(), Error> {
    let ping = bytes_service(node, &service_name(name, "ping")?, 1, false)?;
    let pong = bytes_service(node, &service_name(name, "pong")?, 1, false)?;
    let w = Waiter::new(node, name, mode, "pong", "ping", false)?;
    let sub = pong.subscriber_builder().create()?;
    let publ = publisher(&ping, size)?;
    // the next ping's sample, loaned while the answer is on its way (Spin)
    let mut ahead = if mode == Mode::Spin { Some(loan(&publ, size)?) } else { None };

    let cap = 1 << 22;
    let mut rtt: Vec<f64> = Vec::with_capacity(cap);
    let mut ok = true;
    let t0 = Instant::now();
    let mut n = 0u64;
    let total = loop {
        let a = Instant::now();
        let v = n as u8;
        match ahead.take() {
            Some(sample) => {
                fill_send(sample, v)?;
                ahead = Some(loan(&publ, size)?);
            }
            None => put(&publ, v, size)?,
        }
        w.sent()?;
        let s = w.next(&sub)?;
        // the answer is SIZE bytes, each the sum of our SIZE bytes of v
        let want = (v as u64 * size as u64) as u8;
        ok &= s.payload().len() == size && sum_bytes(s.payload()) == want as u64 * size as u64;
        drop(s);
        let t = Instant::now();
        if rtt.len() < cap {
            rtt.push((t - a).as_secs_f64());
        }
        n += 1;
        if (t - t0).as_secs_f64() >= secs {
            break (t - t0).as_secs_f64();
        }
    };
    drop(ahead); // one loan at a time: the end mark needs it
    put(&publ, 0, 0)?; // the end mark: an empty ping
    w.sent()?;
    rtt.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{{\"round_trips\": {}, \"seconds\": {:.4}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"ok\": {}}}",
        rtt.len(),
        total,
        rtt[rtt.len() / 2] * 1e6,
        rtt[rtt.len() * 99 / 100] * 1e6,
        ok
    );
    Ok(())
}

// ---- reference: iceoryx2's own benchmark's method ---------------------------

/// Pin the calling thread to `cpu` (as iceoryx2's benchmark pins each participant).
fn pin_thread(cpu: usize) -> Result<(), Error> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// A service of one publisher and one subscriber whose queue of one sample
/// overflows safely, as that benchmark makes them.
fn reference_service(node: &Node<ipc::Service>, name: &str, what: &str) -> Result<Bytes, Error> {
    Ok(node
        .service_builder(&service_name(name, what)?)
        .publish_subscribe::<[u8]>()
        .max_publishers(1)
        .max_subscribers(1)
        .history_size(0)
        .subscriber_max_buffer_size(1)
        .enable_safe_overflow(true)
        .create()?)
}

/// A sample of `size` bytes, written once (its --send-copy), never read.
fn reference_sample(
    publ: &Publisher,
    size: usize,
) -> Result<iceoryx2::sample_mut::SampleMut<ipc::Service, [u8], ()>, Error> {
    let mut sample = publ.loan_slice_uninit(size)?;
    sample.payload_mut().fill(MaybeUninit::new(0));
    Ok(unsafe { sample.assume_init() })
}

/// Participant 1 (CPU 0): send, loan the next sample, spin for the answer;
/// for `secs`, then tell participant 2 to stop.  The round trips made.
fn reference_initiator(
    a2b: &Bytes,
    b2a: &Bytes,
    size: usize,
    secs: f64,
    start: &std::sync::Barrier,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(u64, f64), Error> {
    pin_thread(0)?;
    let publ = a2b.publisher_builder().initial_max_slice_len(size).create()?;
    let sub = b2a.subscriber_builder().create()?;
    start.wait();
    let t0 = Instant::now();
    let mut sample = reference_sample(&publ, size)?;
    let mut n = 0u64;
    loop {
        sample.send()?;
        sample = reference_sample(&publ, size)?;
        while sub.receive()?.is_none() {}
        n += 1;
        if n % 1024 == 0 && t0.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    Ok((n, t0.elapsed().as_secs_f64()))
}

/// Participant 2 (CPU 1): loan, spin for the ping, send the answer.
fn reference_responder(
    a2b: &Bytes,
    b2a: &Bytes,
    size: usize,
    start: &std::sync::Barrier,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), Error> {
    pin_thread(1)?;
    let publ = b2a.publisher_builder().initial_max_slice_len(size).create()?;
    let sub = a2b.subscriber_builder().create()?;
    start.wait();
    loop {
        let sample = reference_sample(&publ, size)?;
        while sub.receive()?.is_none() {
            if stop.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(());
            }
        }
        sample.send()?;
    }
}

fn reference(node: &Node<ipc::Service>, name: &str, size: usize, secs: f64) -> Result<(), Error> {
    let a2b = reference_service(node, name, "a2b")?;
    let b2a = reference_service(node, name, "b2a")?;
    let start = std::sync::Barrier::new(2);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (n, t) = std::thread::scope(|sc| -> Result<(u64, f64), Error> {
        let responder = sc.spawn(|| {
            reference_responder(&a2b, &b2a, size, &start, &stop).map_err(|e| e.to_string())
        });
        let r = reference_initiator(&a2b, &b2a, size, secs, &start, &stop);
        stop.store(true, std::sync::atomic::Ordering::Release);
        responder.join().map_err(|_| "the responder panicked")??;
        r
    })?;
    let mean_us = t / n as f64 * 1e6;
    println!(
        "{{\"round_trips\": {}, \"seconds\": {:.4}, \"p50_us\": {:.3}, \"p99_us\": null, \"mean\": true, \"ok\": true}}",
        n, t, mean_us
    );
    Ok(())
}

// ---- main -------------------------------------------------------------------

fn run(args: &[String]) -> Result<(), Error> {
    let serve = args[1] == "serve";
    let (name, test) = (args[2].as_str(), args[3].as_str());
    let size: usize = args[4].parse()?;
    // iceoryx2's warnings (no config file, ...) would only clutter the output
    set_log_level(LogLevel::Error);
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    if serve {
        // what a killed run left (its shared memory) goes now, not at reboot
        node.try_cleanup_dead_nodes();
    }
    let mode = match test {
        "pingpong-wait" => Mode::Wait,
        "pingpong-spin" => Mode::Spin,
        _ => Mode::Yield,
    };
    match (serve, test) {
        (true, "bulk") => serve_bulk(&node, name, size),
        (true, "reference") => {
            println!("ready"); // the client runs both ends
            Ok(())
        }
        (true, _) => serve_pingpong(&node, name, size, mode),
        (false, "bulk") => client_bulk(&node, name, size, args[5].parse()?),
        (false, "reference") => reference(&node, name, size, args[5].parse()?),
        (false, _) => client_pingpong(&node, name, size, args[5].parse()?, mode),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = args.len() < 5
        || !["serve", "client"].contains(&args[1].as_str())
        || !["bulk", "pingpong", "pingpong-wait", "pingpong-spin", "reference"]
            .contains(&args[3].as_str())
        || args.len() != if args[1] == "client" { 6 } else { 5 };
    if usage {
        eprintln!(
            "usage: icebench serve NAME TEST SIZE\n       \
             icebench client NAME TEST SIZE SECONDS\n\
             TEST: bulk, pingpong, pingpong-wait, pingpong-spin or reference"
        );
        std::process::exit(2);
    }
    if let Err(e) = run(&args) {
        eprintln!("icebench: {e}");
        std::process::exit(1);
    }
}
