//! Smoke run.
fn main() {
    let rt = corewise::Runtime::new().unwrap();
    let h = rt.spawn(|| {
        let hs: Vec<_> = (0..100u64).map(|i| corewise::spawn(move || (i, corewise::current_core())).unwrap()).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    }).unwrap();
    let v = h.join().unwrap();
    println!("{:?}", &v[..10]);
    let t = std::time::Instant::now();
    let n = 1_000_000;
    rt.block_on(move || {
        for _ in 0..n { corewise::yield_now(); }
    }).unwrap();
    println!("null yield {:?}", t.elapsed() / n);
    println!("{:?}", rt.core_stats());
}
