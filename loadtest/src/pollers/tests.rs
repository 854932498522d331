use super::*;

fn poll(buyer: u32, due_us: u64, sent_us: u64, answered_us: u64, answer: Answered) -> Poll {
    Poll {
        buyer,
        due_us,
        sent_us,
        allowed_us: due_us,
        answered_us,
        answer,
    }
}

fn waiting(poll_after_ms: u64) -> Answered {
    Answered::Ok {
        state: "waiting".into(),
        poll_after_ms,
    }
}

#[test]
fn the_schedule_hands_out_polls_in_due_order_and_none_before_its_time() {
    let mut schedule = Schedule::with_capacity(4);
    schedule.push(3_000, 2);
    schedule.push(1_000, 7);
    schedule.push(2_000, 1);
    schedule.push(1_000, 3);
    assert_eq!(schedule.len(), 4);
    assert_eq!(schedule.next_due(), Some(1_000));
    assert_eq!(schedule.pop_due(999), None);
    assert_eq!(schedule.pop_due(1_500), Some((1_000, 3)));
    assert_eq!(schedule.pop_due(1_500), Some((1_000, 7)));
    assert_eq!(schedule.pop_due(1_500), None);
    assert_eq!(schedule.next_due(), Some(2_000));
    assert_eq!(schedule.pop_due(10_000), Some((2_000, 1)));
    assert_eq!(schedule.pop_due(10_000), Some((3_000, 2)));
    assert!(schedule.is_empty());
    assert_eq!(schedule.next_due(), None);
}

#[test]
fn the_next_poll_waits_what_the_server_asked_from_the_answer() {
    let answered = poll(0, 0, 10, 5_000, waiting(61_250));
    assert_eq!(answered.next_due_us(), 5_000 + 61_250_000);
    let shed = Answered::Refused {
        status: 503,
        retry_after_secs: Some(2),
    };
    assert_eq!(shed.pause_ms(), 2_000);
    assert_eq!(shed.status_key(), "503");
    let bare = Answered::Refused {
        status: 429,
        retry_after_secs: None,
    };
    assert_eq!(bare.pause_ms(), FALLBACK_PAUSE_MS);
    assert_eq!(Answered::Transport.pause_ms(), FALLBACK_PAUSE_MS);
    assert_eq!(Answered::Transport.status_key(), "error");
    assert_eq!(Answered::Unreadable.status_key(), "200 unreadable");
}

#[test]
fn the_tally_counts_latency_lag_pace_statuses_and_early_polls() {
    let mut tally = Tally::new().unwrap();
    tally.record(&poll(0, 1_000, 1_000, 3_000, waiting(60_000)));
    tally.record(&poll(1, 1_000, 5_000, 6_000, waiting(70_000)));
    tally.record(&poll(
        2,
        1_000,
        1_000,
        9_000,
        Answered::Refused {
            status: 503,
            retry_after_secs: None,
        },
    ));
    tally.record(&poll(3, 1_000, 1_000, 31_000_000, Answered::Transport));
    let mut early = poll(4, 1_000, 1_000, 2_000, waiting(80_000));
    early.allowed_us = 1_001;
    tally.record(&early);
    assert_eq!(tally.polls, 5);
    assert_eq!(tally.early, 1);
    assert_eq!(
        tally.status_counts,
        BTreeMap::from([("200".into(), 3), ("503".into(), 1), ("error".into(), 1)])
    );
    assert_eq!(tally.states, BTreeMap::from([("waiting".into(), 3)]));
    assert!((tally.mean_pace_ms() - 70_000.0).abs() < 1e-9);
    // A transport error has no latency: the slowest is the 503's 8 ms.
    assert_eq!(tally.latency_us.len(), 4);
    assert!(tally.latency_us.max() >= 8_000 && tally.latency_us.max() < 8_100);
    // Sent 4 ms after it was due.
    assert!(tally.lag_us.max() >= 4_000 && tally.lag_us.max() < 4_010);
}

#[test]
fn the_mean_pace_of_no_answer_is_zero() {
    assert_eq!(Tally::new().unwrap().mean_pace_ms(), 0.0);
}

#[test]
fn resident_memory_and_cpu_time_are_read_from_proc() {
    let status = "Name:\tgateway\nVmPeak:\t  900000 kB\nVmRSS:\t   52344 kB\nThreads:\t3\n";
    assert_eq!(vm_rss_kb(status), Some(52_344));
    assert_eq!(vm_rss_kb("Name:\tkthreadd\n"), None);
    // A name with a space and a parenthesis; utime 1500, stime 230.
    let stat = "4242 (gate way)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 230 0 0 20 0 3 0 1 2 3";
    assert_eq!(cpu_ticks(stat), Some(1_730));
    assert_eq!(cpu_ticks("4242 (gateway) S 1"), None);
}

#[test]
fn redis_commands_are_counted_by_command_without_this_clients_own() {
    let before = command_calls(
        "# Commandstats\r\n\
         cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n\
         cmdstat_hget:calls=50,usec=50,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n\
         cmdstat_info:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n",
    );
    assert_eq!(before.get("evalsha"), Some(&100));
    let after = command_calls(
        "# Commandstats\r\n\
         cmdstat_evalsha:calls=700,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n\
         cmdstat_hget:calls=50,usec=50,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n\
         cmdstat_client|list:calls=2,usec=5,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n\
         cmdstat_info:calls=4,usec=40,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n",
    );
    let delta = command_delta(&before, &after, &[("info", 1)]);
    assert_eq!(
        delta,
        BTreeMap::from([("evalsha".into(), 600), ("client|list".into(), 2)])
    );
    let commands = RedisCommands::new(delta, 12_000);
    assert_eq!(commands.total, 602);
    assert!((commands.per_poll - 602.0 / 12_000.0).abs() < 1e-12);
    assert_eq!(RedisCommands::new(BTreeMap::new(), 0).per_poll, 0.0);
}

fn report() -> PollersReport {
    let quantiles = LatencyMs {
        p50: 1.0,
        p90: 2.0,
        p99: 3.0,
        max: 4.0,
    };
    PollersReport {
        product_id: 7,
        pollers: 1000,
        joined: 1000,
        join_failures: BTreeMap::new(),
        join_secs: 2.0,
        join_latency_ms: LatencyMs { ..quantiles },
        window_secs: 10.0,
        polls: 500,
        polls_per_sec: 50.0,
        latency_ms: LatencyMs { ..quantiles },
        status_counts: BTreeMap::from([("200".into(), 500)]),
        states: BTreeMap::from([("waiting".into(), 500)]),
        mean_poll_after_ms: 61_000.0,
        send_lag_ms: quantiles,
        early_polls: 0,
        gateway_rss: Some(Rss {
            before_joins_kb: 20_480,
            window_start_kb: 40_960,
            max_kb: 51_200,
            end_kb: 46_080,
        }),
        gateway_cpu_percent: Some(12.0),
        client_cpu_percent: None,
        redis: Some(RedisCommands::new(
            BTreeMap::from([("evalsha".into(), 100)]),
            500,
        )),
    }
}

#[test]
fn a_run_of_paced_waiting_answers_passes_and_says_its_numbers() {
    let text = report().human();
    assert!(text.contains("polls/s                  50.0"), "{text}");
    assert!(text.contains("max 50.0  end 45.0"), "{text}");
    assert!(text.contains("0.2000 per poll"), "{text}");
    assert!(text.ends_with("VERDICT: PASS"), "{text}");
}

#[test]
fn a_refused_poll_a_failed_join_an_early_poll_or_another_state_fails_it() {
    let mut failing = report();
    failing.status_counts.insert("503".into(), 2);
    failing.join_failures.insert("error".into(), 1);
    failing.states.insert("sold_out".into(), 1);
    failing.early_polls = 3;
    let names: Vec<&str> = failing.failures().iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "joins_answered",
            "polls_answered",
            "all_waiting",
            "paced_by_server"
        ]
    );
    assert!(
        failing.human().ends_with(
            "VERDICT: FAIL (joins_answered, polls_answered, all_waiting, paced_by_server)"
        )
    );
    let mut idle = report();
    idle.polls = 0;
    assert_eq!(idle.failures()[0].name, "polled");
}

#[test]
fn the_json_report_has_the_documented_keys() {
    let value = serde_json::to_value(report()).unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for key in [
        "polls",
        "polls_per_sec",
        "latency_ms",
        "mean_poll_after_ms",
        "gateway_rss",
        "redis",
        "join_secs",
        "early_polls",
    ] {
        assert!(keys.contains(&key), "{key} missing from {keys:?}");
    }
    assert_eq!(value["gateway_rss"]["max_kb"], 51_200);
    assert_eq!(value["redis"]["by_command"]["evalsha"], 100);
}
