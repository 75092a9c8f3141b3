// Checkpointer's saves: synchronous, or with run.checkpoint_async a copy of the state in host
// memory written on a background thread while training goes on. At most one write is in flight;
// the next save, a rollback and the end of the run wait for it. Sharded (fsdp): each rank writes
// its shard file in the background; the checkpoint itself (its file and the manifest entry that
// makes it the newest) is committed when the shards are all complete, at that wait, so that a
// kill during the writes leaves the previous checkpoint the newest.
#include <sys/stat.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/persist/checkpointer.h"
#include "engine/persist/sharded_state.h"
#include "engine/persist/tensor_parallel_state.h"
#include "util/device.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct Checkpointer::Save {
  int64_t step = 0;
  std::map<std::string, double> metrics;
  Clock::time_point start;
  double stall_s = -1.0;                       // training blocked (-1: a synchronous save)
  double wait_s = 0.0;                         // of which waiting for the previous write
  checkpoint::State state;                     // rank 0's (in host memory when asynchronous)
  std::vector<checkpoint::ShardPiece> pieces;  // this rank's shard, in host memory (fsdp)
  std::string shard;                           // its description, or "!rank N: <error>"
  SaveStatus status = kSaved;
  std::string path, msg;  // the file written, or why not
};

void Checkpointer::save(const EvalResult& eval) {
  if (saved_step_ == state_.step) return;
  if (!write(eval)) return;
  saved_step_ = state_.step;
  lost_steps_ = 0;
}

bool Checkpointer::write(const EvalResult& eval) {
  std::map<std::string, double> metrics;
  if (state_.last_eval_step == state_.step && eval.samples > 0) {
    // A language model's predictions are tokens: loss and perplexity, no top-k accuracy.
    metrics = {{"loss", eval.loss}, {"ppl", eval.ppl}};
    if (!eval.sequence) metrics.insert({{"top1", eval.top1}, {"top5", eval.top5}});
    if (!eval.objective.empty()) {  // train.objective's loss and metrics (dpo: TRL's names)
      metrics = {{"loss", eval.loss}};
      metrics.insert(eval.objective.begin(), eval.objective.end());
    }
  }
  // The metrics window's losses averaged over the ranks, so that a resumed run logs what an
  // uninterrupted one does.
  if (parts_.group) parts_.group->all_reduce({state_.window_loss}, distributed::Reduce::avg);
  if (const std::string bad = not_finite(); !bad.empty()) {
    if (job_.rank == 0) {
      log::warn(strprintf(
          "checkpoint at step %" PRId64 " not saved: %s is inf/NaN%s", state_.step, bad.c_str(),
          last_.empty() ? "" : ("; the previous checkpoint " + last_ + " is kept").c_str()));
    }
    return false;
  }
  if (loaded_.cfg.run.checkpoint_async) {
    write_async(std::move(metrics));
    return true;
  }
  // Rank 0 writes (every rank holds the same state; sharded, each rank its shard file first); the
  // others learn how it went.
  Save save;
  save.start = Clock::now();
  save.step = state_.step;
  save.metrics = std::move(metrics);
  std::string shard_error;
  const nlohmann::json shards =
      parts_.fsdp ? gather_shards(write_own_shard(state_.step, shard_pieces()), shard_error)
                  : nlohmann::json();
  if (snapshots_here()) save.state = snapshot();
  if (job_.rank == 0) {
    commit(save, shards, shard_error);
    if (save.status == kSaved) last_ = save.path;
  }
  agree(save.status, save.msg, save.step);  // a failure throws, or is logged and training goes on
  return true;
}

std::string Checkpointer::not_finite() const {
  // [2]: the window's loss, the parameters (this rank's shards or parts); non-zero when not finite.
  auto bad = torch::zeros({2}, torch::TensorOptions(torch::kFloat).device(parts_.device));
  if (state_.window_loss.defined()) {
    bad[0].add_(state_.window_loss.isfinite().logical_not().to(torch::kFloat));
  }
  for (const auto& p : parts_.params) {
    bad[1].add_(p.isfinite().all().logical_not().to(torch::kFloat));
  }
  if (parts_.group) parts_.group->all_reduce({bad}, distributed::Reduce::max);
  const auto host = read_to_host(bad);
  if (host[1].item<float>() > 0) return "a parameter of the model";
  if (host[0].item<float>() > 0) return "the training loss since the last log";
  return "";
}

void Checkpointer::write_async(std::map<std::string, double> metrics) {
  auto job = std::make_shared<Save>();
  job->start = Clock::now();
  wait();
  job->wait_s = seconds_since(job->start);
  job->step = state_.step;
  job->metrics = std::move(metrics);
  if (parts_.fsdp) job->pieces = host_copy(shard_pieces());
  if (snapshots_here()) {
    checkpoint::State state = snapshot();
    if (job_.rank == 0) job->state = {host_copy(state.tensors), std::move(state.meta)};
  }
  job->stall_s = seconds_since(job->start);
  const bool sharded = parts_.fsdp != nullptr;
  const bool writes = job_.rank == 0;
  writer_.start([this, job, sharded, writes] {
    if (sharded) {
      job->shard = write_own_shard(job->step, job->pieces);
      job->pieces.clear();
    } else if (writes) {
      commit(*job, nlohmann::json(), "");
    }
  });
  pending_ = std::move(job);
}

void Checkpointer::wait() {
  if (!pending_) return;
  const auto job = std::exchange(pending_, nullptr);
  writer_.wait();  // the job catches its own errors
  if (parts_.fsdp) {
    std::string shard_error;
    const auto shards = gather_shards(job->shard, shard_error);
    if (job_.rank == 0) {
      commit(*job, shards, shard_error);
    }
  }
  if (job->status == kSaved && !job->path.empty()) last_ = job->path;
  agree(job->status, job->msg, job->step);
}

std::vector<checkpoint::ShardPiece> Checkpointer::shard_pieces() const {
  auto pieces = sharded_pieces(parts_, kModelPrefix, kOptimPrefix);
  for (const SavedPart* part : extras_) {
    for (auto& piece : part->pieces()) {
      piece.name = part->prefix() + piece.name;
      pieces.push_back(std::move(piece));
    }
  }
  return parts_.tp ? tensor_parallel_pieces(parts_, std::move(pieces)) : pieces;
}

std::string Checkpointer::write_own_shard(int64_t step,
                                          const std::vector<checkpoint::ShardPiece>& pieces) const {
  try {
    return checkpoint::write_shard(dir_->path(), step, job_.rank, parts_.world_size(), pieces)
        .dump();
  } catch (const std::exception& e) {
    return "!rank " + std::to_string(job_.rank) + ": " + e.what();
  }
}

nlohmann::json Checkpointer::gather_shards(const std::string& mine, std::string& error) const {
  // Every rank's description (or failure) to rank 0, one rank at a time.
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < parts_.world_size(); ++r) {
    const std::string text =
        parts_.group ? parts_.group->broadcast_text(job_.rank == r ? mine : "", r) : mine;
    if (job_.rank != 0) continue;
    if (!text.empty() && text[0] == '!') {
      error += (error.empty() ? "" : "; ") + text.substr(1);
    } else {
      all.push_back(nlohmann::json::parse(text));
    }
  }
  return all;
}

void Checkpointer::commit(Save& save, const nlohmann::json& shards,
                          const std::string& shard_error) {
  try {
    if (!shard_error.empty()) throw std::runtime_error(shard_error);
    if (parts_.fsdp) save.state.meta["shards"] = shards;
    save.path = dir_->save(save.step, save.state, save.metrics);
    save.state = checkpoint::State();  // the host copy's memory back
    struct stat st;
    double mb = ::stat(save.path.c_str(), &st) == 0 ? st.st_size / 1e6 : 0.0;
    for (const auto& shard : shards) mb += shard.value("bytes", uint64_t{0}) / 1e6;
    std::string how =
        strprintf("%.1f MB%s in %.3f s", mb,
                  shards.empty() ? "" : strprintf(" with %zu shards", shards.size()).c_str(),
                  seconds_since(save.start));
    if (save.stall_s >= 0) {
      how += strprintf(
          "; training blocked %.3f s (%.3f s of it waiting for the previous write), "
          "the rest written in the background",
          save.stall_s, save.wait_s);
    }
    log::info("checkpoint " + save.path + " (" + how + ")");
    save.status = kSaved;
  } catch (const std::exception& e) {
    const std::string previous = last_;  // read on the writing thread only while no save runs
    save.msg = "checkpoint at step " + std::to_string(save.step) + " not saved: " + e.what() +
               (previous.empty() ? "; no earlier checkpoint of this run exists"
                                 : "; the previous checkpoint " + previous + " is intact");
    save.status = loaded_.cfg.run.continue_on_save_error ? kFailedGoOn : kFailedStop;
  }
}

void Checkpointer::agree(SaveStatus status, const std::string& msg, int64_t step) {
  if (parts_.group) {
    auto agreed = torch::full({1}, static_cast<int64_t>(status),
                              torch::TensorOptions(torch::kLong).device(parts_.group->device()));
    parts_.group->broadcast({agreed}, /*root=*/0);
    status = static_cast<SaveStatus>(host_int(agreed));
  }
  if (status == kFailedStop) {
    throw std::runtime_error(job_.rank == 0 ? msg + " (run.continue_on_save_error: true trains on)"
                                            : "rank 0 could not save the checkpoint of step " +
                                                  std::to_string(step) + "; stopping with it");
  }
  if (status == kFailedGoOn && job_.rank == 0) log::error(msg);
}

}  // namespace trainer::engine
