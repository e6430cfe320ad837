//! `corewise-cpus`: prints how many CPUs this process may use (affinity ∩
//! cpuset ∩ ceil(CFS quota), every parent cgroup, v1 and v2), for shell
//! scripts and container entry points: `GOMAXPROCS=$(corewise-cpus)`.

use clap::Parser;

/// How many CPUs may this process use?
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Show each limit (affinity, cpuset, quota, override) and which one set the count.
    #[arg(long)]
    explain: bool,
    /// Print the explanation as one JSON object.
    #[arg(long, conflicts_with = "explain")]
    json: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let e = match corewise_budget::explain() {
        Ok(e) => e,
        Err(err) => {
            eprintln!("corewise-cpus: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", e.to_json());
    } else if args.explain {
        println!("{e}");
    } else {
        println!("{}", e.cores);
    }
    std::process::ExitCode::SUCCESS
}
