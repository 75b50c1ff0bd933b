#include "rails/rail_feeder.h"

#include <pthread.h>

#include <stdexcept>

#include "common/errors.h"
#include "common/error.h"

namespace fairring {

namespace {

using Clock = std::chrono::steady_clock;

// Polls of a chunk's work before the feeder sleeps between them: a slice's
// copy takes tens of microseconds.
constexpr int kSpins = 64;
constexpr auto kNap = std::chrono::microseconds(20);

}  // namespace

RailFeeder::RailFeeder(RailExchange& rail, int rank, std::string waiting_for, std::chrono::milliseconds timeout,
                       RailExchange::Failed failed, std::function<void()> on_start)
    : rail_(rail),
      rank_(rank),
      waiting_for_(std::move(waiting_for)),
      timeout_(timeout),
      failed_(std::move(failed)),
      on_start_(std::move(on_start)),
      thread_([this] { loop(); }) {}

RailFeeder::~RailFeeder() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void RailFeeder::push(RailTask task, Finished finished) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(Item{std::move(task), std::move(finished)});
  }
  cv_.notify_one();
}

void RailFeeder::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

bool RailFeeder::stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void RailFeeder::loop() {
  pthread_setname_np(pthread_self(), "fairring-feed");
  try {
    if (on_start_) on_start_();
    for (;;) {
      Item next;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !items_.empty() || stopping_; });
        if (stopping_) return;
        next = std::move(items_.front());
        items_.pop_front();
      }
      const auto start = Clock::now();
      for (int polls = 0; !next.finished(); ++polls) {
        if (stopping()) return;
        if (Clock::now() - start > timeout_) {
          throw Error(ErrorKind::kBackend,
                      "Timed out waiting for " + waiting_for_ + " (slice " + std::to_string(next.task.slice_seq) + ")");
        }
        if (polls > kSpins) std::this_thread::sleep_for(kNap);
      }
      rail_.post(std::move(next.task));
    }
  } catch (const std::exception& e) {
    failed_(attributed(rank_, e));
  }
}

}  // namespace fairring
