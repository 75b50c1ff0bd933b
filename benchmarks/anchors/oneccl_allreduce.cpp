// oneCCL all-reduce timing for benchmarks/anchors.py (issue 25).
//
// One process per rank, started by Intel MPI's mpiexec (hydra: PMI_RANK,
// PMI_SIZE).  Rank 0 creates oneCCL's main KVS and hands its address to the
// other ranks through a file (--kvs-file); no MPI header is needed to build
// this (with CCL_ATL_TRANSPORT=mpi oneCCL itself runs over Intel MPI).
//
// Timing, the same as `python -m fairring_py.bench` (fairring_py/bench/worker.py):
// float32 SUM, in place; per size two warm-up operations and four
// warm-up samples that estimate the time per op (as allreduce_worker.py), from
// which R, the operations per sample, is chosen so that a sample lasts about
// --sample-ms (at most --max-reps, and R buffers within 64 MiB); then samples: every buffer reset to the input, a
// barrier, R blocking all-reduces back to back on R distinct buffers; the
// sample's time per op is the slowest rank's time / R (a max all-reduce of
// all the samples' times after the size, outside the timed region; samples
// stop early once a size has taken 3 x --time-per-size); the median over
// samples is printed.  Inputs are small integers so every sum is
// exact: every buffer of every sample is compared with the expectation.
//
// Output: one JSON line per size on rank 0's stdout:
//   {"lib": "oneccl", "size": B, "reps": R, "samples": S, "median_s": ..., "p10_s": ..., "p90_s": ...,
//    "checked": N, "error": ""}
//
// Build (benchmarks/anchors.py does it):
//   g++ -O2 -std=c++17 oneccl_allreduce.cpp -I$PREFIX/include -L$PREFIX/lib -lccl -Wl,-rpath,$PREFIX/lib

#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args {
    std::vector<size_t> sizes;
    double time_per_size = 1.5;
    double sample_s = 0.010;
    int max_reps = 5000;
    int min_samples = 5;
    int max_samples = 300;
    size_t budget = size_t(64) << 20;
    std::string kvs_file;
};

int env_int(const char* a, const char* b) {
    const char* v = std::getenv(a);
    if (!v) v = std::getenv(b);
    if (!v) {
        std::fprintf(stderr, "oneccl_allreduce: %s is not set (start it with mpiexec)\n", a);
        std::exit(2);
    }
    return std::atoi(v);
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--sizes") {
            std::stringstream ss(v);
            std::string item;
            while (std::getline(ss, item, ',')) a.sizes.push_back(std::stoull(item));
        } else if (k == "--time-per-size") a.time_per_size = std::stod(v);
        else if (k == "--sample-ms") a.sample_s = std::stod(v) / 1e3;
        else if (k == "--max-reps") a.max_reps = std::stoi(v);
        else if (k == "--min-samples") a.min_samples = std::stoi(v);
        else if (k == "--max-samples") a.max_samples = std::stoi(v);
        else if (k == "--kvs-file") a.kvs_file = v;
        else {
            std::fprintf(stderr, "oneccl_allreduce: unknown option %s\n", k.c_str());
            std::exit(2);
        }
    }
    if (a.sizes.empty() || a.kvs_file.empty()) {
        std::fprintf(stderr, "usage: oneccl_allreduce --sizes B,B,... --kvs-file PATH [--time-per-size S] "
                             "[--sample-ms MS] [--max-reps N] [--min-samples N] [--max-samples N]\n");
        std::exit(2);
    }
    return a;
}

// Rank r, element i: a small integer, different per rank and position.
float input_value(int rank, size_t i) {
    return float(int64_t((i * 7919 + size_t(rank) * 97) % 2001) - 1000 + rank + 1);
}

// CPU time of all the process's threads (oneCCL's and Intel MPI's included).
double process_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double percentile(std::vector<double> xs, double q) {
    std::sort(xs.begin(), xs.end());
    if (xs.empty()) return 0.0;
    double pos = (xs.size() - 1) * q / 100.0;
    size_t lo = size_t(pos), hi = std::min(lo + 1, xs.size() - 1);
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - double(lo));
}

}  // namespace

int main(int argc, char** argv) {
    Args args = parse(argc, argv);
    const int rank = env_int("PMI_RANK", "OMPI_COMM_WORLD_RANK");
    const int size = env_int("PMI_SIZE", "OMPI_COMM_WORLD_SIZE");

    ccl::init();
    ccl::shared_ptr_class<ccl::kvs> kvs;
    if (rank == 0) {
        kvs = ccl::create_main_kvs();
        auto addr = kvs->get_address();
        std::string tmp = args.kvs_file + ".tmp";
        {
            std::ofstream f(tmp, std::ios::binary);
            f.write(addr.data(), addr.size());
        }
        std::rename(tmp.c_str(), args.kvs_file.c_str());
    } else {
        ccl::kvs::address_type addr{};
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        for (;;) {
            std::ifstream f(args.kvs_file, std::ios::binary);
            if (f && f.read(addr.data(), addr.size()) && f.gcount() == std::streamsize(addr.size())) break;
            if (std::chrono::steady_clock::now() > deadline) {
                std::fprintf(stderr, "oneccl_allreduce: rank %d: no KVS address in %s\n", rank, args.kvs_file.c_str());
                return 2;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        kvs = ccl::create_kvs(addr);
    }
    auto comm = ccl::create_communicator(size, rank, kvs);
    if (rank == 0) {
        auto v = ccl::get_library_version();
        std::printf("{\"lib\": \"oneccl\", \"version\": \"%s\", \"ranks\": %d}\n", v.full, size);
        std::fflush(stdout);
    }

    using clock = std::chrono::steady_clock;
    auto barrier = [&] { ccl::barrier(comm).wait(); };
    auto max_over_ranks = [&](std::vector<double> v) {
        ccl::allreduce(v.data(), v.data(), v.size(), ccl::datatype::float64, ccl::reduction::max, comm).wait();
        return v;
    };
    int failures = 0;
    for (size_t bytes : args.sizes) {
        const size_t n = bytes / 4;
        std::vector<float> input(n), expected(n, 0.0f);
        for (size_t i = 0; i < n; i++) {
            input[i] = input_value(rank, i);
            for (int r = 0; r < size; r++) expected[i] += input_value(r, i);
        }
        std::string error;
        size_t checked = 0;
        double cpu = 0;  // CPU time of all the process's threads in the timed loops
        auto run = [&](std::vector<std::vector<float>>& bufs, int count) {
            for (int k = 0; k < count; k++) std::memcpy(bufs[k].data(), input.data(), n * 4);
            barrier();
            const double c0 = process_cpu_s();
            auto t0 = clock::now();
            for (int k = 0; k < count; k++)
                ccl::allreduce(bufs[k].data(), bufs[k].data(), n, ccl::datatype::float32, ccl::reduction::sum, comm)
                    .wait();
            double t = std::chrono::duration<double>(clock::now() - t0).count();
            cpu += process_cpu_s() - c0;
            for (int k = 0; k < count; k++) {
                checked++;
                if (error.empty() && std::memcmp(bufs[k].data(), expected.data(), n * 4) != 0) {
                    size_t bad = 0;
                    while (bufs[k][bad] == expected[bad]) bad++;
                    char msg[256];
                    std::snprintf(msg, sizeof msg, "oneccl: wrong result on rank %d (buffer %d, element %zu): got %g, expected %g",
                                  rank, k, bad, double(bufs[k][bad]), double(expected[bad]));
                    error = msg;
                }
            }
            return t;
        };
        // Warm-up and calibration: two single operations (the second one's slowest
        // rank is a first estimate of the time per op), then four warm-up samples
        // (fewer if R reaches its cap), R from the estimate so far, each refining
        // it (the least seen: noise only slows); R from the final estimate.
        auto choose = [&](double t) {
            long want = t > 0 ? long(args.sample_s / t) : args.max_reps;
            long by_memory = long(args.budget / std::max<size_t>(bytes, 1));
            return int(std::max(1L, std::min({want, long(args.max_reps), by_memory})));
        };
        std::vector<std::vector<float>> bufs(1, std::vector<float>(n));
        run(bufs, 1);
        double per_op = max_over_ranks({run(bufs, 1)})[0];
        for (int c = 0; c < 4; c++) {
            int r = choose(per_op);
            if (int(bufs.size()) < r) bufs.resize(r, std::vector<float>(n));
            per_op = std::min(per_op, max_over_ranks({run(bufs, r)})[0] / r);
            if (r == choose(0.0)) break;  // R at its cap already
        }
        const int reps = choose(per_op);
        double sample_s = per_op * reps;
        int samples = sample_s > 0 ? int(args.time_per_size / sample_s) : args.max_samples;
        samples = std::max(args.min_samples, std::min(args.max_samples, samples));
        bufs.resize(reps, std::vector<float>(n));
        std::vector<double> times;
        cpu = 0;  // the timed samples' only
        auto t_size = clock::now();
        for (int s = 0; s < samples; s++) {
            times.push_back(run(bufs, reps) / reps);
            // Under load samples run slower than calibrated: stop once the size has taken
            // 3 x --time-per-size (every rank agrees: a max over ranks, untimed).
            bool late = std::chrono::duration<double>(clock::now() - t_size).count() > 3 * args.time_per_size;
            if (s + 1 >= args.min_samples && max_over_ranks({late ? 1.0 : 0.0})[0] > 0) break;
        }
        times = max_over_ranks(times);
        const double cpu_per_op = max_over_ranks({cpu / (double(times.size()) * reps)})[0];
        // Any rank's failure is reported: count them over ranks.
        double bad = max_over_ranks({error.empty() ? 0.0 : 1.0})[0];
        if (!error.empty()) std::fprintf(stderr, "%s\n", error.c_str());
        if (bad > 0) failures++;
        if (rank == 0) {
            std::string err = error.empty() && bad > 0 ? "wrong result on another rank (see its stderr)" : error;
            std::printf("{\"lib\": \"oneccl\", \"size\": %zu, \"reps\": %d, \"samples\": %d, \"median_s\": %.9g, "
                        "\"p10_s\": %.9g, \"p90_s\": %.9g, \"cpu_s\": %.9g, \"checked\": %zu, \"error\": \"%s\"}\n",
                        bytes, reps, samples, percentile(times, 50), percentile(times, 10), percentile(times, 90),
                        cpu_per_op, checked, err.c_str());
            std::fflush(stdout);
        }
    }
    barrier();
    return failures ? 1 : 0;
}
