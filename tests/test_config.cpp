// Tests of the configuration loader: parsing, errors, base: inheritance, --set overrides,
// validation and printing.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/loader.h"
#include "engine/setup/components.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace trainer::config;

namespace {

// Loads over the built-in defaults (every model's, data set's and optimizer's keys), as the
// trainer does.
LoadedConfig load(const std::string& path, const std::vector<std::string>& overrides) {
  return trainer::config::load(path, overrides, trainer::engine::config_defaults());
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<trainer::test_support::TempDir>("config");
    dir_ = tmp_->path();
  }
  void TearDown() override { tmp_.reset(); }

  // Writes `text` to dir_/name and returns the path.
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  // The validation issues of a one-line config with `sets` applied, one per line.
  std::string issues_for(const std::vector<std::string>& sets) {
    auto l = load(write("base.yaml", "seed: 1\n"), sets);
    std::string all;
    for (const auto& i : validate(l, Environment{})) all += i.str() + "\n";
    return all;
  }

  // Loads and expects failure; returns the issues.
  std::vector<Issue> fail(const std::string& path, const std::vector<std::string>& overrides = {}) {
    try {
      load(path, overrides);
    } catch (const ConfigError& e) {
      EXPECT_FALSE(e.issues().empty());
      return e.issues();
    }
    ADD_FAILURE() << "expected ConfigError for " << path;
    return {};
  }

  // The single issue of a failing load.
  Issue one(const std::string& path, const std::vector<std::string>& overrides = {}) {
    auto issues = fail(path, overrides);
    EXPECT_EQ(issues.size(), 1u);
    if (issues.size() != 1u)
      for (const auto& i : issues) std::cerr << "  issue: " << i.str() << "\n";
    return issues.empty() ? Issue{} : issues.front();
  }

  std::unique_ptr<trainer::test_support::TempDir> tmp_;
  fs::path dir_;
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

#define EXPECT_HAS(s, part) EXPECT_TRUE(contains((s), (part))) << "in: " << (s)

// ------------------------------------------------------------------------------------------------
// Location and Issue

TEST(LocationTest, Formats) {
  EXPECT_EQ((Location{"a.yaml", 3, 5}).str(), "a.yaml:3:5");
  EXPECT_EQ((Location{"--set x=1", 0, 0}).str(), "--set x=1");
  Issue i{{"a.yaml", 2, 1}, "optim.lr", "must be > 0, got 0"};
  EXPECT_EQ(i.str(), "a.yaml:2:1: optim.lr: must be > 0, got 0");
  Issue j{{"a.yaml", 0, 0}, "", "the file is empty"};
  EXPECT_EQ(j.str(), "a.yaml: the file is empty");
  ConfigError e({i, j});
  EXPECT_EQ(std::string(e.what()), i.str() + "\n" + j.str());
  EXPECT_EQ(e.issues().size(), 2u);
}

// ------------------------------------------------------------------------------------------------
// Parsing

TEST_F(ConfigTest, DefaultsWhenOneKeySet) {
  auto path = write("one.yaml", "seed: 42\n");
  auto l = load(path, {});
  Config d = trainer::engine::config_defaults();
  EXPECT_EQ(l.cfg.seed, 42);
  EXPECT_EQ(l.cfg.optim.lr, d.optim.lr);
  EXPECT_EQ(l.cfg.model.options.value<std::vector<int64_t>>("hidden"),
            d.model.options.value<std::vector<int64_t>>("hidden"));
  EXPECT_EQ(l.cfg.data.batch_size, d.data.batch_size);
  EXPECT_EQ(l.cfg.device, "auto");
  EXPECT_EQ(l.source, path);
  EXPECT_EQ(l.where("seed").str(), path + ":1:1");
  EXPECT_EQ(l.where("optim.lr").str(), path);  // default: no position
  EXPECT_EQ(l.origins.count("optim.lr"), 0u);
}

TEST_F(ConfigTest, NestedValuesParsed) {
  auto path = write("n.yaml",
                    "# a comment\n"
                    "device: cuda:1\n"
                    "model:\n"
                    "  name: lenet\n"
                    "  hidden: [64, 32, 16]\n"
                    "  channels:\n"
                    "    - 8\n"
                    "    - 16\n"
                    "  dropout: 0.25\n"
                    "data:\n"
                    "  shuffle: false\n"
                    "  noise: 1\n"
                    "optim:\n"
                    "  lr: 1e-3\n"
                    "  betas: [0.8, 0.99]\n"
                    "sched:\n"
                    "  milestones: [10, 20]\n"
                    "  warmup_steps: -1\n"
                    "amp:\n"
                    "  dtype: \"float16\"\n");
  auto c = load(path, {}).cfg;
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_EQ(c.model.name, "lenet");
  EXPECT_EQ(c.model.options.value<std::vector<int64_t>>("hidden"),
            (std::vector<int64_t>{64, 32, 16}));
  EXPECT_EQ(c.model.options.value<std::vector<int64_t>>("channels"), (std::vector<int64_t>{8, 16}));
  EXPECT_DOUBLE_EQ(c.model.options.value<double>("dropout"), 0.25);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_DOUBLE_EQ(c.data.options.value<double>("noise"), 1.0);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.options.value<std::vector<double>>("betas"), (std::vector<double>{0.8, 0.99}));
  EXPECT_EQ(c.sched.milestones, (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(c.sched.warmup_steps, -1);
  EXPECT_EQ(c.amp.dtype, "float16");
}

TEST_F(ConfigTest, CrlfAndInlineTabs) {
  auto c = load(write("crlf.yaml", "seed:\t5\r\noptim:\r\n  lr: 0.5  # peak\r\n"), {}).cfg;
  EXPECT_EQ(c.seed, 5);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
}

TEST_F(ConfigTest, IntegerOutOfRange) {
  auto i = one(write("big.yaml", "seed: 99999999999999999999\n"));
  EXPECT_HAS(i.message, "expected an integer, got '99999999999999999999' (out of range");
}

TEST_F(ConfigTest, EmptySectionKeepsDefaults) {
  auto path = write("s.yaml", "optim:\n  # lr: 0.5\nseed: 1\n");
  auto c = load(path, {}).cfg;
  EXPECT_DOUBLE_EQ(c.optim.lr, Config{}.optim.lr);
}

// ------------------------------------------------------------------------------------------------
// File and YAML errors

TEST_F(ConfigTest, TabIndentation) {
  auto path = write("tab.yaml", "optim:\n  lr: 0.1\n\tmomentum: 0.5\n");
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_EQ(i.where.line, 3);
  EXPECT_EQ(i.where.column, 1);
  EXPECT_HAS(i.message, "tabs are not allowed for indentation");
  EXPECT_HAS(i.str(), path + ":3:1");
}

TEST_F(ConfigTest, DuplicateKey) {
  auto path = write("dup.yaml", "seed: 1\noptim:\n  lr: 0.1\n  momentum: 0.5\n  lr: 0.2\n");
  auto i = one(path);
  EXPECT_EQ(i.where.line, 5);
  EXPECT_EQ(i.where.column, 3);
  EXPECT_EQ(i.key, "optim.lr");
  EXPECT_HAS(i.message, "duplicate key 'lr' (first at line 3)");
}

TEST_F(ConfigTest, DuplicateTopLevelKey) {
  auto path = write("dup2.yaml", "seed: 1\nseed: 2\n");
  auto i = one(path);
  EXPECT_EQ(i.where.line, 2);
  EXPECT_HAS(i.message, "duplicate key 'seed'");
}

TEST_F(ConfigTest, BadIndentation) {
  auto path = write("indent.yaml", "optim:\n  lr: 0.1\n momentum: 0.5\n");
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_EQ(i.where.line, 3);
  EXPECT_GT(i.where.column, 0);
  EXPECT_HAS(i.message, "indentation");

  auto path2 = write("indent2.yaml", "seed: 1\n  deterministic: true\n");
  auto j = one(path2);
  EXPECT_EQ(j.where.line, 2);
  EXPECT_HAS(j.message, "indentation");
}

TEST_F(ConfigTest, UnclosedFlowList) {
  auto i = one(write("flow.yaml", "model:\n  hidden: [1, 2\n"));
  EXPECT_GT(i.where.line, 0);
  EXPECT_HAS(i.message, "not closed");
}

TEST_F(ConfigTest, EmptyFile) {
  auto path = write("empty.yaml", "");
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_EQ(i.where.line, 0);
  EXPECT_HAS(i.message, "the file is empty; expected a mapping of config keys");
  EXPECT_HAS(i.str(), path + ": the file is empty");
}

TEST_F(ConfigTest, CommentOnlyFile) {
  auto i = one(write("comments.yaml", "# nothing here\n\n   # still nothing\n"));
  EXPECT_HAS(i.message, "the file is empty");
}

TEST_F(ConfigTest, BinaryFile) {
  auto i = one(write("bin.yaml", std::string("seed: 1\n\x00\x01\x02garbage", 18)));
  EXPECT_HAS(i.message, "not a text YAML file");
  auto j = one(write("latin1.yaml", "seed: 1\nrun:\n  dir: caf\xe9\n"));
  EXPECT_HAS(j.message, "not a text YAML file");
  EXPECT_EQ(j.where.line, 3);
}

TEST_F(ConfigTest, Utf8TextIsFine) {
  auto c = load(write("utf8.yaml", "run:\n  dir: runs/caf\xc3\xa9\n"), {}).cfg;
  EXPECT_EQ(c.run.dir, "runs/caf\xc3\xa9");
}

TEST_F(ConfigTest, Directory) {
  fs::create_directories(dir_ / "sub.yaml");
  auto path = (dir_ / "sub.yaml").string();
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_HAS(i.message, "directory");
}

TEST_F(ConfigTest, MissingFile) {
  auto path = (dir_ / "nope.yaml").string();
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_HAS(i.message, "no such file");
}

TEST_F(ConfigTest, TopLevelList) {
  auto path = write("list.yaml", "- seed\n- 1\n");
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_HAS(i.message, "expected a mapping of config keys at the top level, got a list");
}

TEST_F(ConfigTest, TopLevelScalar) {
  auto i = one(write("scalar.yaml", "hello\n"));
  EXPECT_HAS(i.message, "expected a mapping");
}

TEST_F(ConfigTest, MissingBaseFile) {
  auto path = write("child.yaml", "seed: 1\nbase: missing.yaml\n");
  auto i = one(path);
  EXPECT_EQ(i.where.file, path);
  EXPECT_EQ(i.where.line, 2);
  EXPECT_EQ(i.where.column, 1);
  EXPECT_EQ(i.key, "base");
  EXPECT_HAS(i.message, (dir_ / "missing.yaml").string());
  EXPECT_HAS(i.message, "not found");
}

TEST_F(ConfigTest, BaseCycleOfTwo) {
  auto a = write("a.yaml", "base: b.yaml\nseed: 1\n");
  write("b.yaml", "seed: 2\nbase: a.yaml\n");
  auto i = one(a);
  EXPECT_HAS(i.message, "base cycle: ");
  EXPECT_HAS(i.message, "a.yaml -> ");
  EXPECT_HAS(i.message, "b.yaml -> ");
  EXPECT_EQ(i.where.file, (dir_ / "b.yaml").string());
  EXPECT_EQ(i.where.line, 2);
}

TEST_F(ConfigTest, BaseSelfCycle) {
  auto a = write("self.yaml", "base: ./self.yaml\nseed: 1\n");
  auto i = one(a);
  EXPECT_HAS(i.message, "base cycle: ");
  EXPECT_HAS(i.message, "self.yaml -> ");
  EXPECT_EQ(i.where.line, 1);
}

// ------------------------------------------------------------------------------------------------
// Unknown keys and types

TEST_F(ConfigTest, UnknownKeyWithSuggestion) {
  auto path = write("u.yaml", "seed: 1\noptim:\n  lr: 0.1\n  lrr: 0.2\n");
  auto i = one(path);
  EXPECT_EQ(i.key, "optim.lrr");
  EXPECT_EQ(i.where.line, 4);
  EXPECT_EQ(i.where.column, 3);
  EXPECT_EQ(i.str(), path + ":4:3: optim.lrr: unknown key; did you mean optim.lr?");
}

TEST_F(ConfigTest, UnknownKeyInWrongSection) {
  auto i = one(write("w.yaml", "lr: 0.1\n"));
  EXPECT_EQ(i.key, "lr");
  EXPECT_HAS(i.message, "did you mean optim.lr?");
  auto j = one(write("w2.yaml", "optimm:\n  lr: 0.1\n"));
  EXPECT_HAS(j.message, "did you mean optim?");
}

TEST_F(ConfigTest, UnknownKeyWithoutCloseMatch) {
  auto i = one(write("far.yaml", "zzzzzzzzzz: 1\n"));
  EXPECT_EQ(i.message, "unknown key");
}

TEST_F(ConfigTest, WrongTypes) {
  auto check = [&](const std::string& text, const std::string& key, const std::string& msg) {
    auto i = one(write("t.yaml", text));
    EXPECT_EQ(i.key, key) << text;
    EXPECT_HAS(i.message, msg);
    EXPECT_EQ(i.where.line, 1) << text;
  };
  check("seed: abc\n", "seed", "expected an integer, got 'abc'");
  check("seed: 3.0\n", "seed", "expected an integer, got '3.0'");
  check("optim: {lr: fast}\n", "optim.lr", "expected a number, got 'fast'");
  check("deterministic: maybe\n", "deterministic", "expected true or false, got 'maybe'");
  check("device: [cpu]\n", "device", "expected a string, got a list");
  check("model: {hidden: [1, x]}\n", "model.hidden", "expected a list of integers, got 'x'");
  check("model: {hidden: 64}\n", "model.hidden", "expected a list of integers, got '64'");
  check("optim: {betas: [0.9, no]}\n", "optim.betas", "expected a list of numbers");
  check("optim: 3\n", "optim", "expected a mapping");
  check("seed: {a: 1}\n", "seed", "expected an integer, got a mapping");
  check("seed: ~\n", "seed", "expected an integer, got null");
  check("seed:\n", "seed", "expected an integer, got null");
  check("device: null\n", "device", "expected a string, got null");
}

TEST_F(ConfigTest, StringsAcceptAnyScalar) {
  auto c = load(write("s.yaml", "device: 1\nmodel: {name: yes}\ndata: {root: '~'}\n"), {}).cfg;
  EXPECT_EQ(c.device, "1");
  EXPECT_EQ(c.model.name, "yes");
  EXPECT_EQ(c.data.root, "~");
}

TEST_F(ConfigTest, SeveralProblemsTogether) {
  auto path = write("many.yaml", "sed: 1\noptim:\n  lr: abc\n  momentun: 0.5\n");
  auto issues = fail(path);
  ASSERT_EQ(issues.size(), 3u);
  std::string all;
  for (const auto& i : issues) all += i.str() + "\n";
  EXPECT_HAS(all, path + ":1:1: sed: unknown key; did you mean seed?");
  EXPECT_HAS(all, path + ":3:3: optim.lr: expected a number, got 'abc'");
  EXPECT_HAS(all, path + ":4:3: optim.momentun: unknown key; did you mean optim.momentum?");
}

// The README's example: an unknown key and a value out of range are reported together.
TEST_F(ConfigTest, UnknownKeysAndRangeProblemsTogether) {
  auto path = write("mine.yaml", "optim:\n  lrr: 0.1\ndata:\n  batch_size: 0\n");
  auto issues = fail(path, {"sched.gamma=0"});
  std::string all;
  for (const auto& i : issues) all += i.str() + "\n";
  EXPECT_EQ(issues.size(), 3u) << all;
  EXPECT_HAS(all, path + ":2:3: optim.lrr: unknown key; did you mean optim.lr?");
  EXPECT_HAS(all, path + ":4:3: data.batch_size: must be >= 1, got 0");
  EXPECT_HAS(all, "--set sched.gamma=0: sched.gamma: must be in (0, 1], got 0");
  // A setting that only some machines allow waits for check(), which knows the machine.
  auto machine = fail(write("cuda.yaml", "sed: 1\ndevice: cuda:7\n"));
  EXPECT_EQ(machine.size(), 1u);
}

TEST_F(ConfigTest, IssuesFromFileAndOverridesTogether) {
  auto path = write("fo.yaml", "sed: 1\n");
  try {
    load(path, {"optim.lr=abc", "bogus"});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.issues().size(), 3u);
    std::string what = e.what();
    EXPECT_HAS(what, "sed: unknown key");
    EXPECT_HAS(what, "--set optim.lr=abc: optim.lr: expected a number, got 'abc'");
    EXPECT_HAS(what, "--set bogus: expected KEY.PATH=VALUE");
  }
}

// ------------------------------------------------------------------------------------------------
// base: inheritance

TEST_F(ConfigTest, BaseDeepMerge) {
  write("base.yaml",
        "seed: 7\n"
        "optim:\n"
        "  name: adam\n"
        "  lr: 0.5\n"
        "  momentum: 0.8\n"
        "model:\n"
        "  hidden: [1, 2, 3]\n");
  auto child = write("child.yaml",
                     "base: base.yaml\n"
                     "optim:\n"
                     "  lr: 0.01\n"
                     "model:\n"
                     "  hidden: [9]\n");
  auto l = load(child, {});
  EXPECT_EQ(l.cfg.seed, 7);
  EXPECT_EQ(l.cfg.optim.name, "adam");
  EXPECT_DOUBLE_EQ(l.cfg.optim.lr, 0.01);
  EXPECT_DOUBLE_EQ(l.cfg.optim.options.value<double>("momentum"), 0.8);
  EXPECT_EQ(l.cfg.model.options.value<std::vector<int64_t>>("hidden"),
            (std::vector<int64_t>{9}));  // sequences replace
  EXPECT_EQ(l.where("optim.lr").str(), child + ":3:3");
  EXPECT_EQ(l.where("optim.momentum").str(), (dir_ / "base.yaml").string() + ":5:3");
  EXPECT_EQ(l.cfg.run.dir, "runs/child");  // from the top-level file, not the base
}

TEST_F(ConfigTest, BaseRelativeToChildDirectory) {
  write("configs/common/base.yaml", "data:\n  batch_size: 32\n  workers: 0\n");
  write("configs/exp/mid.yaml", "base: ../common/base.yaml\ndata:\n  workers: 4\n");
  auto top = write("configs/exp/sub/top.yaml", "base: ../mid.yaml\nseed: 3\n");
  auto c = load(top, {}).cfg;
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_EQ(c.data.workers, 4);
  EXPECT_EQ(c.seed, 3);
}

TEST_F(ConfigTest, BaseInSubdirectoryAndAbsolute) {
  auto base = write("bases/b.yaml", "seed: 11\n");
  auto child = write("c.yaml", "base: bases/b.yaml\n");
  EXPECT_EQ(load(child, {}).cfg.seed, 11);
  auto child2 = write("other/c2.yaml", "base: " + base + "\ndevice: cpu\n");
  auto c2 = load(child2, {}).cfg;
  EXPECT_EQ(c2.seed, 11);
  EXPECT_EQ(c2.device, "cpu");
}

TEST_F(ConfigTest, BaseChainOfThree) {
  write("l1.yaml", "seed: 1\noptim: {lr: 0.1, momentum: 0.1, weight_decay: 0.1}\n");
  write("l2.yaml", "base: l1.yaml\nseed: 2\noptim: {momentum: 0.2, weight_decay: 0.2}\n");
  auto top = write("l3.yaml", "base: l2.yaml\noptim:\n  weight_decay: 0.3\n");
  auto c = load(top, {}).cfg;
  EXPECT_EQ(c.seed, 2);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.options.value<double>("momentum"), 0.2);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.3);
}

TEST_F(ConfigTest, ErrorsInBaseFileNameTheBase) {
  write("bad_base.yaml", "optim:\n  lrr: 1\n");
  auto child = write("ok.yaml", "base: bad_base.yaml\n");
  auto i = one(child);
  EXPECT_EQ(i.where.str(), (dir_ / "bad_base.yaml").string() + ":2:3");
  EXPECT_EQ(i.key, "optim.lrr");
}

// ------------------------------------------------------------------------------------------------
// Overrides

TEST_F(ConfigTest, OverridesTyped) {
  auto path = write("o.yaml", "seed: 1\noptim:\n  lr: 0.5\n");
  auto l = load(path, {"seed=5", "optim.lr=1e-3", "data.shuffle=false", "model.hidden=[64,32]",
                       "run.dir=x", "optim.momentum=-1", "model.dropout=0.5", "model.pretrained="});
  EXPECT_EQ(l.cfg.seed, 5);
  EXPECT_DOUBLE_EQ(l.cfg.optim.lr, 1e-3);
  EXPECT_FALSE(l.cfg.data.shuffle);
  EXPECT_EQ(l.cfg.model.options.value<std::vector<int64_t>>("hidden"),
            (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(l.cfg.run.dir, "x");
  EXPECT_DOUBLE_EQ(l.cfg.optim.options.value<double>("momentum"), -1.0);
  EXPECT_DOUBLE_EQ(l.cfg.model.options.value<double>("dropout"), 0.5);
  EXPECT_EQ(l.cfg.model.pretrained, "");
  // Origins record the override, exactly as given.
  EXPECT_EQ(l.where("optim.lr").file, "--set optim.lr=1e-3");
  EXPECT_EQ(l.where("optim.lr").line, 0);
  EXPECT_EQ(l.where("optim.lr").str(), "--set optim.lr=1e-3");
  EXPECT_EQ(l.where("seed").str(), "--set seed=5");
}

TEST_F(ConfigTest, LaterOverrideWins) {
  auto path = write("o.yaml", "seed: 1\n");
  auto l = load(path, {"seed=2", "seed=3"});
  EXPECT_EQ(l.cfg.seed, 3);
  EXPECT_EQ(l.where("seed").str(), "--set seed=3");
}

TEST_F(ConfigTest, OverrideSectionAsMapping) {
  auto path = write("o.yaml", "seed: 1\n");
  auto c = load(path, {"optim={lr: 0.2, name: adam}"}).cfg;
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.2);
  EXPECT_EQ(c.optim.name, "adam");
}

TEST_F(ConfigTest, OverrideErrors) {
  auto path = write("o.yaml", "seed: 1\n");
  auto i = one(path, {"optim.lrr=0.1"});
  EXPECT_EQ(i.str(), "--set optim.lrr=0.1: optim.lrr: unknown key; did you mean optim.lr?");
  auto j = one(path, {"optim.lr"});
  EXPECT_EQ(j.where.file, "--set optim.lr");
  EXPECT_HAS(j.message, "expected KEY.PATH=VALUE");
  auto k = one(path, {"=3"});
  EXPECT_HAS(k.message, "KEY.PATH=VALUE");
  auto m = one(path, {"seed=abc"});
  EXPECT_EQ(m.str(), "--set seed=abc: seed: expected an integer, got 'abc'");
  auto n = one(path, {"seed.x=1"});
  EXPECT_HAS(n.message, "unknown key");
  auto o = one(path, {"model.hidden=[1,"});
  EXPECT_HAS(o.message, "cannot parse");
}

// ------------------------------------------------------------------------------------------------
// run.dir default

TEST_F(ConfigTest, RunDirDefaultsToStem) {
  auto path = write("configs/quickstart.yaml", "seed: 1\n");
  auto l = load(path, {});
  EXPECT_EQ(l.cfg.run.dir, "runs/quickstart");
  EXPECT_EQ(l.origins.count("run.dir"), 0u);
  auto path2 = write("configs/named.yaml", "run:\n  dir: out/here\n");
  EXPECT_EQ(load(path2, {}).cfg.run.dir, "out/here");
}

// ------------------------------------------------------------------------------------------------
// validate / check

TEST_F(ConfigTest, DefaultsValidate) {
  auto l = load(write("ok.yaml", "seed: 1\n"), {});
  Environment env;
  EXPECT_TRUE(validate(l, env).empty());
  EXPECT_NO_THROW(check(l, env));
}

TEST_F(ConfigTest, RangeErrorsCollected) {
  auto path = write("r.yaml",
                    "run:\n"
                    "  log_every: 0\n"
                    "  progress: sometimes\n"
                    "model:\n"
                    "  kernel_size: 4\n"
                    "  channels: [8]\n"
                    "  dropout: 1.0\n"
                    "  checkpointing: every:0\n"
                    "data:\n"
                    "  shape: [1, 0]\n"
                    "optim:\n"
                    "  lr: -0.1\n"
                    "  betas: [0.9, 1.5]\n"
                    "sched:\n"
                    "  milestones: [5, 5]\n"
                    "  gamma: 0\n");
  auto l = load(path, {});
  auto issues = validate(l, Environment{});
  std::string all;
  for (const auto& i : issues) all += i.str() + "\n";
  EXPECT_EQ(issues.size(), 11u) << all;
  EXPECT_HAS(all, path + ":2:3: run.log_every: must be >= 1, got 0");
  EXPECT_HAS(all, "run.progress: must be one of auto, always, never, got 'sometimes'");
  EXPECT_HAS(all, path + ":5:3: model.kernel_size: must be odd and >= 1, got 4");
  EXPECT_HAS(all, "model.channels: must have exactly 2 entries, got 1");
  EXPECT_HAS(all, "model.dropout: must be in [0, 1), got 1");
  EXPECT_HAS(all, "model.checkpointing: must be none, blocks, offload or every:N");
  EXPECT_HAS(all, "data.shape: every entry must be >= 1, got 0");
  EXPECT_HAS(all, path + ":12:3: optim.lr: must be >= 0, got -0.1");
  EXPECT_HAS(all, "optim.betas: every entry must be in [0, 1), got 1.5");
  EXPECT_HAS(all, "sched.milestones: must be strictly increasing");
  EXPECT_HAS(all, "sched.gamma: must be in (0, 1], got 0");
  EXPECT_THROW(check(l, Environment{}), ConfigError);
}

TEST_F(ConfigTest, MoreRangeRules) {
  EXPECT_HAS(issues_for({"train.epochs=0"}), "train.epochs: must be >= 1");
  EXPECT_EQ(issues_for({"train.epochs=0", "train.max_steps=10"}), "");
  EXPECT_HAS(issues_for({"optim.nesterov=true", "optim.momentum=0"}), "optim.nesterov:");
  EXPECT_HAS(issues_for({"sched.name=cosine", "sched.min_lr=0.5", "optim.lr=0.1"}),
             "sched.min_lr: must be < optim.lr");
  EXPECT_EQ(issues_for({"sched.name=constant", "sched.min_lr=0.5", "optim.lr=0.1"}), "");
  EXPECT_HAS(issues_for({"data.num_classes=1"}), "data.num_classes: must be >= 2, got 1");
  EXPECT_HAS(issues_for({"device=gpu"}), "device: must be auto, cpu, cuda or cuda:N, got 'gpu'");
  EXPECT_HAS(issues_for({"dist.backend=mpi"}), "dist.backend: must be one of auto, nccl, gloo");
  EXPECT_HAS(issues_for({"model.checkpointing=blocks"}), "");
  EXPECT_EQ(issues_for({"model.checkpointing=every:2"}), "");
  EXPECT_HAS(issues_for({"optim.eps=0"}), "optim.eps: must be > 0, got 0");
  EXPECT_HAS(issues_for({"data.noise=-0.5"}), "data.noise: must be >= 0, got -0.5");
  EXPECT_EQ(issues_for({"train.stop_at_top1=0.916"}), "");
  EXPECT_HAS(issues_for({"train.stop_at_top1=91.6"}),
             "train.stop_at_top1: must be a fraction in [0, 1] (0 = off), got 91.6");
  EXPECT_EQ(issues_for({"train.stop_at.metric=val/loss", "train.stop_at.below=0.925"}), "");
  EXPECT_HAS(issues_for({"train.stop_at.metric=val/los", "train.stop_at.below=1"}),
             "train.stop_at.metric: must be one of val/loss, val/ppl");
  EXPECT_HAS(issues_for({"train.stop_at.below=1"}), "train.stop_at.metric: is not set");
  EXPECT_HAS(issues_for({"train.stop_at.metric=val/loss"}), "train.stop_at.below: is not set");
  EXPECT_HAS(issues_for({"train.stop_at.metric=val/top1", "train.stop_at.above=0.5",
                         "train.stop_at.below=1"}),
             "train.stop_at.above: cannot be set with train.stop_at.below");
  EXPECT_HAS(issues_for({"train.stop_at.metric=val_ema/loss", "train.stop_at.below=1"}),
             "train.stop_at.metric: is 'val_ema/loss', a metric of train.ema's average");
}

TEST_F(ConfigTest, DataPipelineRules) {
  EXPECT_EQ(
      issues_for({"data.hflip=1", "data.crop_padding=4", "data.mean=[0.5]", "data.std=[0.2]"}), "");
  EXPECT_HAS(issues_for({"data.hflip=1.5"}), "data.hflip: must be a probability in [0, 1]");
  EXPECT_HAS(issues_for({"data.crop_padding=-1"}), "data.crop_padding: must be >= 0");
  EXPECT_HAS(issues_for({"data.mean=[0.5, 0.5, 0.5]"}),
             "data.std: must have as many entries as data.mean (3), got 0");
  EXPECT_HAS(issues_for({"data.mean=[0.1, 0.2]", "data.std=[1, 1]"}),
             "data.mean: must have 1 or 3 entries");
  EXPECT_HAS(issues_for({"data.mean=[0.5]", "data.std=[0]"}), "data.std: every entry must be > 0");
  EXPECT_HAS(issues_for({"data.crop_scale=[0.5, 0.2]"}),
             "data.crop_scale: must be two numbers [low, high] with 0 < low <= high <= 1");
  EXPECT_HAS(issues_for({"data.crop_ratio=[0.75]"}), "data.crop_ratio: must be two numbers");
  EXPECT_HAS(issues_for({"data.image_size=300"}), "data.resize_size: must be >= data.image_size");
  EXPECT_HAS(issues_for({"data.on_error=ignore"}), "data.on_error: must be one of skip, fail");
  EXPECT_HAS(issues_for({"data.token_format=u16"}),
             "data.token_format: must be one of auto, uint16, uint32, bytes");
  EXPECT_HAS(issues_for({"data.val_fraction=1"}), "data.val_fraction: must be in (0, 1)");
  EXPECT_HAS(issues_for({"sched.warmup_epochs=5", "sched.warmup_steps=10"}),
             "sched.warmup_epochs: set either");
  EXPECT_EQ(issues_for({"sched.warmup_epochs=0.5"}), "");
}

TEST_F(ConfigTest, AmpFloat16OnCpu) {
  auto path = write("amp.yaml", "device: cpu\namp:\n  enabled: true\n  dtype: float16\n");
  auto l = load(path, {});
  auto issues = validate(l, Environment{});
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].key, "amp.dtype");
  EXPECT_EQ(issues[0].where.str(), path + ":4:3");
  EXPECT_HAS(issues[0].message,
             "float16 autocast needs a CUDA device; use amp.dtype: bfloat16 or a cuda device");
  // device auto without CUDA: same problem; with CUDA: fine.
  auto l2 = load(path, {"device=auto"});
  EXPECT_EQ(validate(l2, Environment{}).size(), 1u);
  Environment cuda{true, 1, {}};
  EXPECT_TRUE(validate(l2, cuda).empty());
  EXPECT_TRUE(validate(load(path, {"amp.dtype=bfloat16"}), Environment{}).empty());
}

TEST_F(ConfigTest, CudaDeviceWithoutCuda) {
  auto path = write("cuda.yaml", "device: cuda\n");
  auto issues = validate(load(path, {}), Environment{});
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(
      issues[0].str(),
      path + ":1:1: device: no CUDA device is available; use device: cpu or auto (got 'cuda')");
  Environment two{true, 2, {}};
  EXPECT_TRUE(validate(load(path, {"device=cuda:1"}), two).empty());
  auto bad = validate(load(path, {"device=cuda:2"}), two);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_HAS(bad[0].message, "cuda:2 does not exist");
  EXPECT_EQ(bad[0].where.str(), "--set device=cuda:2");
  auto nccl = validate(load(path, {"device=cpu", "dist.backend=nccl"}), Environment{});
  ASSERT_EQ(nccl.size(), 1u);
  EXPECT_EQ(nccl[0].key, "dist.backend");
}

TEST_F(ConfigTest, CudaGraphNamesWhatItCannotCapture) {
  const Environment cuda{true, 1, {}};
  EXPECT_HAS(issues_for({"train.cuda_graph=true"}), "train.cuda_graph: needs a CUDA device");
  auto with = [&](std::vector<std::string> sets) {
    sets.push_back("train.cuda_graph=true");
    sets.push_back("device=cuda");
    std::string all;
    for (const auto& i : validate(load(write("g.yaml", "seed: 1\n"), sets), cuda)) {
      all += i.str() + "\n";
    }
    return all;
  };
  EXPECT_EQ(with({}), "");
  EXPECT_HAS(with({"optim.impl=foreach"}), "train.cuda_graph: needs optim.impl fused");
  EXPECT_HAS(with({"model.checkpointing=blocks"}), "cannot capture model.checkpointing");
  EXPECT_HAS(with({"data.drop_last=false"}), "needs batches of one shape");
  EXPECT_HAS(with({"dist.find_unused_parameters=true"}), "cannot capture DDP's reducer");
}

TEST_F(ConfigTest, RegistryChoices) {
  auto path = write("reg.yaml", "model:\n  name: lenat\noptim:\n  name: foo\n");
  Environment env;
  env.choices["model.name"] = {"lenet", "mlp"};
  env.choices["optim.name"] = {"sgd", "adam", "adamw"};
  env.choices["data.name"] = {"synthetic"};
  auto issues = validate(load(path, {}), env);
  ASSERT_EQ(issues.size(), 2u);
  std::string all = issues[0].str() + "\n" + issues[1].str();
  EXPECT_HAS(all, path +
                      ":2:3: model.name: unknown model.name 'lenat'; registered: lenet, mlp (did "
                      "you mean lenet?)");
  EXPECT_HAS(all,
             path + ":4:3: optim.name: unknown optim.name 'foo'; registered: sgd, adam, adamw");
  EXPECT_FALSE(contains(all, "foo'; registered: sgd, adam, adamw (did"));
  try {
    check(load(path, {}), env);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.issues().size(), 2u);
  }
}

// ------------------------------------------------------------------------------------------------
// to_yaml and key_paths

// Compares two configs: the printed form covers every field (doubles print exactly), plus
// direct checks of a sample of fields.
void expect_equal(const Config& a, const Config& b) {
  EXPECT_EQ(to_yaml(a), to_yaml(b));
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.run.dir, b.run.dir);
  EXPECT_EQ(a.model.pretrained, b.model.pretrained);
  EXPECT_EQ(a.data.root, b.data.root);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.options.value<double>("eps"), b.optim.options.value<double>("eps"));
  EXPECT_EQ(a.optim.options.value<std::vector<double>>("betas"),
            b.optim.options.value<std::vector<double>>("betas"));
  EXPECT_EQ(a.sched.min_lr, b.sched.min_lr);
  EXPECT_EQ(a.sched.milestones, b.sched.milestones);
  EXPECT_EQ(a.model.options.value<double>("dropout"), b.model.options.value<double>("dropout"));
  EXPECT_EQ(a.data.options.value<double>("noise"), b.data.options.value<double>("noise"));
  EXPECT_EQ(a.dist.bucket_cap_mb, b.dist.bucket_cap_mb);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.model.name, b.model.name);
  EXPECT_EQ(a.model.checkpointing, b.model.checkpointing);
  EXPECT_EQ(a.train.loss, b.train.loss);
}

TEST_F(ConfigTest, ToYamlRoundTrip) {
  Config c = trainer::engine::config_defaults();
  c.seed = -7;
  c.deterministic = true;
  c.device = "cuda:0";
  c.run.dir = "runs/a b#c";
  c.model.name = "yes";
  c.model.pretrained = "";
  c.model.checkpointing = "every:2";
  c.data.root = "1";
  c.train.loss = "null";
  c.amp.dtype = "a\"b\\c\nd\te";
  c.optim.lr = 3e-4;
  c.optim.options.set("eps", 1e-8);
  c.optim.options.set("momentum", 0.1);
  c.optim.options.set("betas", std::vector<double>{0.1, 1.0 / 3.0});
  c.sched.min_lr = 1e-300;
  c.sched.milestones = {};
  c.sched.gamma = 0.30000000000000004;
  c.model.options.set("dropout", 2.5e-5);
  c.data.options.set("noise", 123456789.125);
  c.data.shuffle = false;
  c.dist.bucket_cap_mb = 25;
  c.model.options.set("hidden", std::vector<int64_t>{});

  std::string y = to_yaml(c);
  EXPECT_HAS(y, "optim:\n  name: sgd\n  lr: 0.0003\n");
  EXPECT_HAS(y, "  eps: 1e-8\n");
  EXPECT_HAS(y, "  momentum: 0.1\n");
  EXPECT_HAS(y, "  hidden: []\n");
  EXPECT_HAS(y, "  channels: [32, 64]\n");
  EXPECT_HAS(y, "  name: \"yes\"\n");
  EXPECT_HAS(y, "  pretrained: \"\"\n");
  EXPECT_HAS(y, "device: cuda:0\n");
  EXPECT_FALSE(contains(y, "base:"));
  EXPECT_EQ(y.rfind("seed: -7\ndeterministic: true\ndevice: cuda:0\nrun:\n  dir: ", 0), 0u) << y;

  auto path = write("round.yaml", y);
  auto back = load(path, {}).cfg;
  expect_equal(c, back);
  EXPECT_EQ(back.model.name, "yes");
  EXPECT_EQ(back.model.pretrained, "");
  EXPECT_EQ(back.data.root, "1");
  EXPECT_EQ(back.train.loss, "null");
  EXPECT_EQ(back.amp.dtype, c.amp.dtype);
  EXPECT_EQ(back.run.dir, "runs/a b#c");
  EXPECT_EQ(back.optim.options.value<std::vector<double>>("betas")[1], 1.0 / 3.0);
  EXPECT_EQ(back.sched.gamma, 0.30000000000000004);
  EXPECT_EQ(back.sched.min_lr, 1e-300);
  EXPECT_EQ(back.model.options.value<std::vector<int64_t>>("hidden"), std::vector<int64_t>{});
  // Every field was set from the file.
  auto l = load(path, {});
  for (const auto& k : key_paths(trainer::engine::config_defaults()))
    EXPECT_EQ(l.origins.count(k), 1u) << k;
}

TEST_F(ConfigTest, ToYamlOfDefaultsRoundTrips) {
  Config d = trainer::engine::config_defaults();
  d.run.dir = "runs/x";
  auto back = load(write("d.yaml", to_yaml(d)), {}).cfg;
  expect_equal(d, back);
  EXPECT_EQ(to_yaml(back), to_yaml(d));
}

// Entries that share a key (mlp, lenet, gpt and vit share model.dropout) share its type and
// default: a config lists the key once, and loading it back gives every entry that value.
TEST(EntriesTest, SharedKeysHaveOneTypeAndDefault) {
  // Each field's type and default as text.
  struct Describe final : FieldVisitor {
    std::map<std::string, std::string>* out;
    void operator()(const char* n, bool& f) override { put(n, "bool", f ? "true" : "false"); }
    void operator()(const char* n, int64_t& f) override { put(n, "int", std::to_string(f)); }
    void operator()(const char* n, double& f) override { put(n, "double", std::to_string(f)); }
    void operator()(const char* n, std::string& f) override { put(n, "string", f); }
    void operator()(const char* n, std::vector<int64_t>& f) override {
      put(n, "ints", std::to_string(f.size()));
    }
    void operator()(const char* n, std::vector<double>& f) override {
      put(n, "doubles", std::to_string(f.size()));
    }
    void put(const char* name, const std::string& type, const std::string& value) {
      (*out)[name] = type + " " + value;
    }
  };
  const Config defaults = trainer::engine::config_defaults();
  for (const Entries* section :
       {&defaults.model.options, &defaults.data.options, &defaults.optim.options}) {
    std::map<std::string, std::pair<std::string, std::string>> first;  // key -> (entry, described)
    for (const auto& [entry, options] : section->all()) {
      std::map<std::string, std::string> fields;
      Describe describe;
      describe.out = &fields;
      options->clone()->visit(describe);
      for (const auto& [key, described] : fields) {
        const auto [it, added] = first.emplace(key, std::make_pair(entry, described));
        EXPECT_TRUE(added || it->second.second == described)
            << key << ": " << it->second.first << " has " << it->second.second << ", " << entry
            << " has " << described;
      }
    }
  }
}

TEST(KeyPathsTest, ContainsLeavesInOrder) {
  auto keys = key_paths(trainer::engine::config_defaults());
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(keys.front(), "seed");
  auto pos = [&](const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) - keys.begin();
  };
  EXPECT_LT(pos("optim.lr"), static_cast<long>(keys.size()));
  EXPECT_LT(pos("run.dir"), static_cast<long>(keys.size()));
  EXPECT_LT(pos("run.dir"), pos("optim.lr"));
  EXPECT_EQ(pos("optim"), static_cast<long>(keys.size()));  // sections are not leaves
  EXPECT_EQ(pos("dist.timeout_s") + 1, pos("launch.nproc_per_node"));
  EXPECT_EQ(pos("launch.nproc_per_node") + 1, pos("tracking.csv"));
  EXPECT_EQ(pos("profile.memory_snapshot_step") + 1, pos("dpo.loss_type"));
  EXPECT_EQ(pos("dpo.cpo_alpha"), static_cast<long>(keys.size()) - 1);
}

}  // namespace

// data.mix: a list of data sections, each read from the data sets' defaults, located, written
// back as YAML and replaced whole by --set.
TEST_F(ConfigTest, DataMixIsAListOfDataSetsThatRoundTrips) {
  const auto path = write("mix.yaml",
                          "data:\n"
                          "  name: mix\n"
                          "  mix:\n"
                          "    - {name: synthetic, noise: 0.25, weight: 0.7}\n"
                          "    - name: fashion_mnist\n"
                          "      root: /x\n"
                          "      weight: 0.3\n");
  const auto l = load(path, {});
  EXPECT_TRUE(validate(l, Environment{}).empty());
  const auto& items = l.cfg.data.mix.items;
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].name, "synthetic");
  EXPECT_EQ(items[0].weight, 0.7);
  EXPECT_EQ(items[0].options.value<double>("noise"), 0.25);
  EXPECT_EQ(items[1].name, "fashion_mnist");
  EXPECT_EQ(items[1].root, "/x");
  EXPECT_EQ(items[1].options.value<double>("noise"), 0.5);  // not the other part's
  EXPECT_EQ(l.cfg.data.options.value<double>("noise"), 0.5);
  EXPECT_EQ(l.where("data.mix[1].root").line, 6);
  EXPECT_EQ(l.where("data.mix").line, 3);

  const std::string y = to_yaml(l.cfg);
  EXPECT_HAS(y, "  mix:\n    - name: synthetic\n      root: \"\"\n      weight: 0.7\n");
  EXPECT_HAS(y, "    - name: fashion_mnist\n      root: /x\n      weight: 0.3\n");
  const auto back = load(write("back.yaml", y), {});
  EXPECT_EQ(to_yaml(back.cfg), y);
  ASSERT_EQ(back.cfg.data.mix.items.size(), 2u);
  EXPECT_EQ(back.cfg.data.mix.items[0].options.value<double>("noise"), 0.25);
  const auto flat = lookup(l.cfg, "data.mix");
  ASSERT_TRUE(flat.has_value());
  EXPECT_EQ(flat->rfind("[{name: synthetic, root: \"\", weight: 0.7, ", 0), 0u) << *flat;
  EXPECT_HAS(*flat, "}, {name: fashion_mnist, root: /x, weight: 0.3, ");

  const auto set = load(path, {"data.mix=[{name: cifar10, root: /c, weight: 2}]"});
  ASSERT_EQ(set.cfg.data.mix.items.size(), 1u);
  EXPECT_EQ(set.cfg.data.mix.items[0].name, "cifar10");
  EXPECT_EQ(set.cfg.data.mix.items[0].weight, 2.0);
  EXPECT_EQ(load(path, {"data.mix=[]"}).cfg.data.mix.items.size(), 0u);
  EXPECT_EQ(to_yaml(trainer::engine::config_defaults()).find("mix: []\n") != std::string::npos,
            true);
}

TEST_F(ConfigTest, DataMixProblemsNameTheItemAndItsKey) {
  const auto l = load(write("bad.yaml",
                            "data:\n"
                            "  mix:\n"
                            "    - {name: synthetic, weight: -1}\n"
                            "    - {std: [0.5]}\n"),
                      {});
  std::string all;
  for (const auto& i : validate(l, Environment{})) all += i.str() + "\n";
  EXPECT_HAS(all, "bad.yaml:3:25: data.mix[0].weight: must be a positive number, got -1");
  EXPECT_HAS(all, "bad.yaml:4:8: data.mix[1].std: must have as many entries as data.mean");
  EXPECT_HAS(all, "data.mix[1].name: name the data set of this part of data.mix");

  auto unknown = fail(write("unknown.yaml", "data:\n  mix:\n    - {name: synthetic, noize: 1}\n"));
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_EQ(unknown[0].key, "data.mix[0].noize");
  EXPECT_EQ(unknown[0].where.line, 3);
  EXPECT_HAS(unknown[0].message, "unknown key");
  auto scalar = one(write("scalar.yaml", "data:\n  mix: 5\n"));
  EXPECT_EQ(scalar.key, "data.mix");
  EXPECT_HAS(scalar.message, "expected a list of mappings");
  auto item = one(write("item.yaml", "data:\n  mix: [{name: synthetic}, 3]\n"));
  EXPECT_HAS(item.message, "expected a mapping of keys (name: ...) at item 2, got '3'");
}
