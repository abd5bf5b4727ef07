//! Drives the consumers' per-record bookkeeping from memory (`spillway_kafka::cost`), for
//! instruction counts under callgrind (bench/README.md, issue 18):
//!
//! ```text
//! per_record_cost share 100000
//! per_record_cost classic 300000
//! per_record_cost share-wide 100000    # 500 acquired per fetch out of stored batches of 8,000
//! ```

fn main() {
    let mut args = std::env::args().skip(1);
    let part = args.next().unwrap_or_else(|| "share".to_string());
    let records: usize = args
        .next()
        .map(|n| n.parse().expect("records: a number"))
        .unwrap_or(100_000);
    let batch = 500;
    let done = match part.as_str() {
        "share" => spillway_kafka::cost::share_cycles(records, batch),
        "share-wide" => spillway_kafka::cost::share_cycles_in(records, batch, 8_000),
        "classic" => spillway_kafka::cost::classic_cycles(records, batch),
        other => panic!("part: share, share-wide or classic, not {other}"),
    };
    println!("{part}: {done} records");
}
