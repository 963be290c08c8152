#include "verify/verify.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "comm/comm_choice.h"
#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "comm/comm_threads.h"
#include "core/cores.h"
#include "core/host_memory.h"
#include "core/progress.h"
#include "model/routed_experts.h"
#include "train/simulate.h"
#include "verify/faults.h"
#include "verify/loss_causes.h"
#include "verify/reference_logs.h"
#include "verify/weight_probe.h"

namespace ptool {
namespace {

class InProcess final : public Launch {
public:
    bool shares_memory() const override { return true; }
    InProcess(Device d, CommOptions c) : device_(d), comm_(c) {}
    bool rank0() const override { return true; }
    void run(int ranks, const SourceLocation&, const std::function<void(Communicator&)>& fn,
             std::shared_ptr<CoreSlots> cores) override {
        run_ranks(ranks, comm_, fn, device_, std::move(cores));
    }
    void wait_for_rank0() override {}
    int exit_code(const std::function<int()>& body) override { return body(); }

private:
    Device device_;
    CommOptions comm_;
};

class UnderMpi final : public Launch {
public:
    bool shares_memory() const override { return false; }
    // The processes of a node share its cores as rank threads do (GemmThreadShare): OpenBLAS's
    // default in each process is every core its affinity allows, which depends on how the launcher
    // binds it, and a GEMM's last bits depend on the thread count (an mpirun run differed from the
    // same plan on rank threads in its last bits where mpirun left each process both cores).
    UnderMpi(Device d, CommOptions c) : share_(std::max(1, launcher_local_rank().size), 1) {
        mpi_init_once();
        world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, c);
        CommOptions patient = c;
        patient.timeout_seconds = 0;  // rank 0's reference may take longer than any collective
        patient_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, patient);
        // on GPUs the ranks' collectives go through NCCL, bootstrapped over MPI
        if (d == Device::cuda) gpus_ = make_nccl_world(*world_, c);
    }
    bool rank0() const override { return world_->rank() == 0; }
    void run(int ranks, const SourceLocation& where, const std::function<void(Communicator&)>& fn,
             std::shared_ptr<CoreSlots>) override {
        if (ranks != world_->size())
            throw InputError(
                where, fmt::format("the mesh has {} ranks but mpirun started {}", ranks, world_->size()));
        fn(gpus_ ? *gpus_ : *world_);
    }
    void wait_for_rank0() override { patient_->barrier(); }
    int exit_code(const std::function<int()>& body) override {
        int code = 3;
        try {
            code = body();
        } catch (const InputError& e) {
            mpi_abort_job(e.what(), 2);
        } catch (
            const RuntimeError& e) {  // a message that names its rank (a timeout, a mismatch) goes as it is
            mpi_abort_job(
                e.names_rank() ? e.what() : fmt::format("rank {} failed: {}", world_->rank(), e.what()), 3);
        } catch (const std::exception& e) {
            mpi_abort_job(fmt::format("rank {} failed: {}", world_->rank(), e.what()), 3);
        }
        Tensor t = Tensor::scalar(code, DType::float32);  // every process exits with rank 0's verdict
        patient_->broadcast(t, 0);
        return static_cast<int>(t.item());
    }

private:
    GemmThreadShare share_;
    std::unique_ptr<MpiCommunicator> world_, patient_;
    std::unique_ptr<Communicator> gpus_;
};

// Every rank's memory on rank 0 (verification's: not counted).
std::vector<RankMemory> gather_memory(const RankMemory& m, Communicator& world) {
    const int64_t width = 2 + kMemoryUses;
    Tensor mine({width}, DType::int64), all({width * world.size()}, DType::int64);
    mine.data<int64_t>()[0] = m.peak, mine.data<int64_t>()[1] = m.resident;
    for (int u = 0; u < kMemoryUses; ++u) mine.data<int64_t>()[2 + u] = m.at_peak[u];
    CountingPaused pause(world.counter().get());
    world.all_gather(mine, all);
    std::vector<RankMemory> out(world.size());
    for (int r = 0; r < world.size(); ++r) {
        const int64_t* v = all.data<int64_t>() + r * width;
        out[r].rank = r, out[r].peak = v[0], out[r].resident = v[1];
        for (int u = 0; u < kMemoryUses; ++u) out[r].at_peak[u] = v[2 + u];
    }
    return out;
}

// Adds one plan's comparison with the reference to the report (rank 0).
void add_plan(VerifyReport& report, const RunRecord& reference, RunRecord parallel, const Plan& plan,
              const Resolution& res, const std::vector<Diagnostic>& causes, const Tolerance& tol,
              bool strict) {
    PlanReport rep = compare_runs(reference, parallel, plan, tol);
    rep.warnings = diagnostic_strings(res.warnings);
    for (const MeshDim& d : plan.mesh()) rep.mesh.emplace_back(d.name, d.size);
    if (strict && !rep.warnings.empty()) {
        rep.pass = false;
        rep.notes.push_back(fmt::format("FAIL under --strict: {} warning{} count as failures, the first: {}",
                                        rep.warnings.size(), rep.warnings.size() == 1 ? "" : "s",
                                        rep.warnings[0]));
    }
    if (!rep.pass)
        for (const Diagnostic& c : causes) rep.notes.push_back("cause: " + c.str());
    rep.run = std::move(parallel);
    report.pass = report.pass && rep.pass;
    report.plans.push_back(std::move(rep));
    report.reference = reference;
}

// A plan whose run refused its own schedule (train/schedule.h ScheduleViolation: the runtime's
// order, a W before its I): it fails, nothing compared, the violation as its localisation (rank 0).
void add_unrunnable(VerifyReport& report, const Plan& plan, const std::string& why, const Tolerance& tol) {
    PlanReport rep;
    rep.plan_path = plan.path;
    rep.pass = false;
    rep.tol = tol;
    rep.run.world_size = plan.world_size(), rep.run.backend = "not run";
    rep.localisation = "first divergence: the schedule, before any step: " + why;
    for (const MeshDim& d : plan.mesh()) rep.mesh.emplace_back(d.name, d.size);
    report.pass = false;
    report.plans.push_back(std::move(rep));
}

// A reference step's tensors once every rank compared with them: the names stay (compare_runs
// reads them with the parallel run's diffs), scalars (loss, grad norm) too; a published step is
// never written by the reference again.
void drop_tensors(StepRecord& step) {
    for (auto& [name, t] : step.tensors)
        if (t.numel() > 1) t = Tensor();
    for (ModuleEvent& e : step.events) e.full = Tensor();
}

// The cp ranks of a plan whose attention runs the ring (1: none): its reference reports each ring
// step's values as the plan's ranks hold them (Run::probe_ring), for localisation.
int ring_parts(const Plan& plan) {
    const bool ring = plan.context_parallel && plan.context_parallel->rotate == RotateMethod::alltoall;
    return ring ? plan.dims.size(DimRole::cp) : 1;
}

// What makes two plans' references differ: their microbatches, their mixed precision, the ring
// layout their events follow, and their float8 casts.
std::string numerics_key(const Plan& plan, const Model& model) {
    // the microbatches a step cuts the batch into (the rounds of gradient_accumulation, the plan's or
    // the model's, each of a pipeline's microbatches), and the mixed precision policy
    const int64_t n = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    std::string m = n > 1 ? fmt::format("m{}", n) : "";
    if (plan.normalization(model) == LossNormalization::global_tokens) m += "g";
    if (const int parts = ring_parts(plan); parts > 1)
        m += fmt::format("ring{}{}", parts, plan.context_parallel->load_balance ? "b" : "");
    if (plan.float8) {  // its recipe, the linears it converts and the rows each scale covers
        const Plan reference = reference_plan(plan);
        const Float8Spec& f8 = *reference.float8;
        const Float8RowGroups& g = f8.row_groups;
        m += fmt::format("f8{}:{}x{}{}", float8_recipe_name(f8.recipe), g.data, g.cp,
                         g.load_balance ? "b" : "");
        if (f8.filter_fqns) m += fmt::format("[{}]", fmt::join(*f8.filter_fqns, ","));
        // its weights cast from the masters, which differs from a cast of their copies in param_dtype
        if (!f8.weights_from_masters.empty() && plan.mixed_precision &&
            plan.mixed_precision->param_dtype != model.dtype)
            m += fmt::format("w[{}]", fmt::join(f8.weights_from_masters, ","));
    }
    if (!plan.mixed_precision) return m;
    const MixedPrecisionSpec& mp = *plan.mixed_precision;
    return fmt::format("{}{}/{}/{}", m, dtype_name(mp.param_dtype), dtype_name(mp.reduce_dtype),
                       mp.cast_forward_inputs);
}

// A plan's reference plan (reference_plan) resolved once against the probe (rank 0's, when it
// records a reference): the memory check beside the ranks simulates it and the reference runs it.
struct ResolvedReference {
    const Plan plan;
    const Resolution resolution;
    const ResolvedPlan resolved;
    ResolvedReference(const Plan& of, const Model& probe)
        : plan(reference_plan(of)),
          resolution(resolve_plan(probe, plan)),
          resolved{&plan, &probe, &resolution} {}
    ResolvedReference(const ResolvedReference&) = delete;
    ResolvedReference& operator=(const ResolvedReference&) = delete;
};

// Whether the host can hold the reference beside the parallel run: on the CPU with two cores or
// more, and when the reference's predicted peak (train/simulate.h, on meta tensors) is at most half
// the memory the host has available (the other half for the ranks and the records). Else, or when
// the prediction fails, the reference runs first, as under mpirun.
bool room_beside(const RunInputs& in, const ResolvedReference& reference, int64_t steps) {
    if (in.device != Device::cpu || usable_cores() < 2) return false;
    const int64_t available = available_host_memory();
    if (available <= 0) return false;
    try {
        const RankSimulation sim = simulate_rank(in, reference.plan, 0, steps, false, 0, &reference.resolved);
        return 2 * std::max(sim.memory.peak, sim.memory.resident) <= available;
    } catch (const std::exception&) {
        return false;
    }
}

// The reference recording on a thread of its own beside the parallel run (rank 0 of one process),
// on a core of its own from the start: the ranks take turns on the others (one slot each while it
// computes) and get the reference's core when it ends; OpenBLAS's threads are divided among the
// ranks and the reference. The ranks read each step once it is published.
struct ReferenceBeside {
    std::shared_ptr<CoreSlots> cores;                    // the ranks'
    std::shared_ptr<CoreSlots> own_core;                 // the reference's
    std::unique_ptr<const ResolvedReference> reference;  // what it runs
    ReferenceStream stream;
    GemmThreadShare share;
    std::exception_ptr error;
    std::thread thread;

    // throttled: the ranks release each step once compared (VerifyJob::keep_reference off)
    ReferenceBeside(const RunInputs& in, const Plan& plan, std::unique_ptr<const ResolvedReference> ref,
                    int64_t steps, RecordOptions opt, bool throttled)
        : cores(std::make_shared<CoreSlots>(usable_cores() - 1)),
          own_core(std::make_shared<CoreSlots>(1)),
          reference(std::move(ref)),
          stream(cores, throttled),
          share(plan.world_size() + 1, plan.world_size() + 1) {
        opt.publish = &stream;
        thread = std::thread([this, &in, plan, steps, opt] {
            try {
                record_reference(in, plan, steps, opt, own_core, &reference->resolved);
            } catch (...) {
                error = std::current_exception();
            }
            cores->release();  // its core to the ranks
            stream.finish(stream.cancelled() ? nullptr
                                             : error);  // stopped by the ranks' failure: theirs is the cause
        });
    }
    ~ReferenceBeside() {
        if (thread.joinable()) stream.cancel(), thread.join();
    }
    // The whole record, once the parallel run ended (rethrows the reference's failure)
    RunRecord end() {
        thread.join();
        if (error) std::rethrow_exception(error);
        return std::move(stream.record);
    }
    // After the parallel run failed: stops the reference; its own failure, if it failed first, is the cause
    void end_after_failure() {
        stream.cancel();
        thread.join();
        if (stream.failed()) std::rethrow_exception(error);
    }
};

}  // namespace

std::unique_ptr<Launch> in_process_launch(Device device, const CommOptions& comm) {
    return std::make_unique<InProcess>(device, comm);
}

std::unique_ptr<Launch> make_launch(Device device, const CommOptions& comm) {
    if (launched_by_mpi()) return std::make_unique<UnderMpi>(device, comm);
    return in_process_launch(device, comm);
}

int64_t steps_for(const Plan& plan, const VerifyOptions& opt, int64_t model_steps) {
    if (opt.steps > 0) return opt.steps;
    if (plan.verify.steps > 0) return plan.verify.steps;
    return model_steps;
}

Tolerance tolerance_for(const Plan& plan, const VerifyOptions& opt, const Model& model) {
    int depth = 0;  // leaf modules: no tensor is further than that from the output
    for_each_module(*model.root, [&](const std::string&, Module& m) { depth += m.children().empty(); });
    // mixed precision: the compute dtype's rule, the masters' for the parameters
    const DType compute = plan.compute_dtype(model.dtype);
    Tolerance tol =
        Tolerance::for_policy(model.dtype, compute, depth).with(plan.verify.tolerance).with(opt.tolerance);
    // a loss of the outputs themselves is judged with them (Tolerance::loss_of_outputs)
    tol.loss_of_outputs = model.loss == LossKind::sum    ? Tolerance::OutputSum::sum
                          : model.loss == LossKind::mean ? Tolerance::OutputSum::mean
                                                         : Tolerance::OutputSum::none;
    tol.output_eps = dtype_eps(compute);
    tol.clip_max_norm = model.clip_grad_norm;  // localisation tells the clip's common factor apart
    return tol;
}

RunRecord record_reference(const RunInputs& in, const Plan& plan, int64_t steps, const RecordOptions& opt,
                           std::shared_ptr<CoreSlots> cores, const ResolvedPlan* reference) {
    std::optional<Plan> own;  // reference_plan(plan), unless resolved already
    if (!reference) own = reference_plan(plan);
    const Plan& single = reference ? *reference->plan : *own;
    RunRecord rec;
    run_ranks(
        1, CommOptions{},
        [&](Communicator& world) {
            Run run(in, single, world, nullptr, reference);
            run.follow_reference(opt.logs, false);
            if (const int parts = ring_parts(plan); parts > 1 && opt.events)
                run.probe_ring(parts, plan.context_parallel->load_balance);
            rec = record_run(run, steps, opt);
        },
        in.device, std::move(cores));
    (opt.publish ? opt.publish->record : rec).backend = "reference";
    return rec;
}

namespace {

// rank 0, by step count and numerics: one reference serves every plan that computes alike
using ReferenceKey = std::pair<int64_t, std::string>;

// What verify holds across the job's plans: the model as read, the references recorded so far and
// their logs (a model with experts: its routing; a plan with float8: its operands).
struct VerifyState {
    const VerifyJob& job;
    Launch& launch;
    const std::shared_ptr<const Model> model;  // the job's, else parsed here
    const Model& probe;  // every plan's lint is resolved against it, and rebound to every rank's model
    // a model with experts: each reference logs its routing, which the parallel runs follow
    // (model/routing_log.h); a plan with float8 its float8 operands (model/float8_log.h). The
    // reference then runs first, whole, so that every step's log is there before a rank's step
    // reaches it.
    bool experts = false;
    std::map<ReferenceKey, RunRecord> references;
    std::map<ReferenceKey, OwnedLogs> logs;
    VerifyReport report;

    VerifyState(const VerifyJob& j, Launch& l)
        : job(j),
          launch(l),
          model(j.model ? j.model
                        : std::make_shared<const Model>(load_model_text(
                              j.inputs.model_text, j.inputs.model_path, j.inputs.dtype_override, false))),
          probe(*model) {
        report.dtype = probe.dtype;
        for_each_module(*probe.root,
                        [&](const std::string&, Module& m) { experts |= m.routed_experts() != nullptr; });
    }
    ReferenceKey reference_key(const Plan& p) const {
        return ReferenceKey{steps_for(p, job.options, probe.steps), numerics_key(p, probe)};
    }
    // whether a plan after plan i reads this reference
    bool read_later(size_t i, const ReferenceKey& key) const {
        return std::any_of(job.plans.begin() + static_cast<std::ptrdiff_t>(i) + 1, job.plans.end(),
                           [&](const Plan& p) { return reference_key(p) == key; });
    }
    // the last plan that reads this reference, rank-locally, and no one reads it whole after
    // (VerifyJob::keep_reference): each step's tensors go once compared
    bool drops_reference(size_t i, const ReferenceKey& key) const {
        return launch.shares_memory() && !job.keep_reference && !read_later(i, key);
    }
};

// The lint's causes, and what the step's data makes of the loss
std::vector<Diagnostic> plan_causes(const VerifyState& s, const Plan& plan, const Resolution& res,
                                    int64_t steps) {
    const RunInputs& in = s.job.inputs;
    const Model& probe = s.probe;
    std::vector<Diagnostic> causes = res.causes;
    const DataSource data(probe, in.data, in.data_path);
    const auto found = loss_normalization_causes(probe, plan, data, steps, targets_where(probe, in));
    causes.insert(causes.end(), found.begin(), found.end());
    return causes;
}

RecordOptions parallel_record_options(const VerifyState& s, const Plan& plan) {
    RecordOptions ro;
    ro.events = s.job.options.events;
    ro.shadow_optimizer = true;
    ro.rank_local = s.launch.shares_memory();
    ro.golden = s.job.golden;
    ro.tol = tolerance_for(plan, s.job.options, s.probe);
    ro.resync = true;  // each step judged from the state the runs agree on (recorder.h)
    return ro;
}

// Rank 0's reference for `key`, not yet recorded: beside the ranks when the host has room (returned),
// else recorded first, whole, into s.references (null returned).
std::unique_ptr<ReferenceBeside> start_reference(VerifyState& s, const Plan& plan, int64_t steps,
                                                 const RecordOptions& ro, const ReferenceKey& key, bool drop,
                                                 std::unique_ptr<const ResolvedReference> reference) {
    RecordOptions ref = ro;
    ref.shadow_optimizer = false;   // with a golden, the reference continues from its parameters
    OwnedLogs& logs = s.logs[key];  // each at the elementwise rule verify holds its tensors to
    if (s.experts) logs.routing = std::make_unique<RoutingLog>(ro.tol.rtol, ro.tol.atol);
    if (plan.float8) logs.float8 = std::make_unique<Float8Log>(ro.tol.rtol, ro.tol.atol);
    ref.logs = logs.view();
    if (s.job.options.reference_beside && s.launch.shares_memory() && !s.experts && !plan.float8 &&
        room_beside(s.job.inputs, *reference, steps)) {
        Progress::get().phase(fmt::format("reference + parallel {}", plan.path),
                              fmt::format("{} step{}, the reference on one device beside {} ranks, "
                                          "each step compared once both recorded it",
                                          steps, steps == 1 ? "" : "s", plan.world_size()));
        auto beside =
            std::make_unique<ReferenceBeside>(s.job.inputs, plan, std::move(reference), steps, ref, drop);
        s.report.reference_beside = true;
        return beside;
    }
    Progress::get().phase("reference", fmt::format("{} step{} on one device", steps, steps == 1 ? "" : "s"));
    ref.on_step = [steps](int64_t k, double, double) { Progress::get().step("reference", k, steps); };
    s.references[key] = record_reference(s.job.inputs, plan, steps, ref, nullptr, &reference->resolved);
    s.report.reference_seconds += s.references[key].seconds;
    return nullptr;
}

// On rank 0 the parallel run's tensors are compared with `reference` as they are recorded (following
// the reference beside, when it runs there), and with `drop` each reference step's tensors go once
// compared.
void compare_as_recorded(RecordOptions& ro, RunRecord* reference, ReferenceBeside* beside, bool drop,
                         const Plan& plan, int64_t steps) {
    ro.compare_with = reference;
    ro.follow = beside ? &beside->stream : nullptr;
    if (drop)
        ro.done_with_reference_step = [reference, stream = beside ? &beside->stream : nullptr](int64_t k) {
            drop_tensors(reference->steps[static_cast<size_t>(k)]);
            if (stream) stream->released(k);
        };
    if (!beside)
        Progress::get().phase(
            fmt::format("parallel {}", plan.path),
            fmt::format("{} ranks, each step compared as it is recorded", plan.world_size()));
    ro.on_step = [steps](int64_t k, double, double) { Progress::get().step("parallel", k, steps); };
}

// The parallel run as rank 0 gathered it: its record with every rank's memory, and what its ranks
// took from the reference's logs at near-ties.
struct ParallelRun {
    RunRecord record;
    TakenFromLogs taken;
};

// `resolved`: the lint's resolution of `plan`, which every rank's Run rebinds to its own model (under
// mpirun each process's own lint).
ParallelRun run_parallel(const VerifyState& s, const ResolvedPlan& resolved, int64_t steps,
                         const RecordOptions& ro, const ReferenceLogs& logs, ReferenceBeside* beside,
                         const std::function<void(Schedule&)>& change = {}) {
    const Plan& plan = *resolved.plan;
    const VerifyJob& job = s.job;
    Launch& launch = s.launch;
    const bool experts = s.experts;
    ParallelRun par;
    try {
        launch.run(
            plan.world_size(), plan.mesh_where,
            [&](Communicator& world) {
                // rank threads read rank 0's logs; the ranks of an mpirun job receive them
                OwnedLogs received;
                const ReferenceLogs follow =
                    launch.shares_memory()
                        ? logs
                        : received_logs(logs, world, received, experts, plan.float8.has_value());
                const std::unique_ptr<RunLayer> layer = fault_layer(job.options.fault);
                // each rank's tensors are charged to its account (verification's own are not: the
                // recorder's work runs unaccounted), the measured side of explain's prediction
                auto account = std::make_shared<MemoryAccount>();
                RunRecord r;
                RankMemory mine;
                {
                    MemoryScope scope(account);
                    Run run(job.inputs, plan, world, layer.get(), &resolved);
                    if (change) {  // a localisation probe's (verify/weight_probe.h)
                        Schedule changed = run.schedule();
                        change(changed);
                        run.set_schedule(std::move(changed));
                    }
                    if (job.options.replay_ties) run.follow_reference(follow, true);
                    account->reset_peak();
                    mine.resident = account->live();
                    r = record_run(run, steps, ro);
                    mine.peak = account->peak();
                    for (int u = 0; u < kMemoryUses; ++u)
                        mine.at_peak[u] = account->at_peak(static_cast<MemoryUse>(u));
                }
                std::vector<RankMemory> all = gather_memory(mine, world);
                const TakenFromLogs taken = total_taken(follow, world, launch.shares_memory());
                if (world.rank() == 0) {
                    par.record = std::move(r);
                    par.record.memory = std::move(all);
                    par.taken = taken;
                }
            },
            beside ? beside->cores : nullptr);
    } catch (...) {
        if (beside) beside->end_after_failure();  // the reference's own failure, if that was the cause
        throw;
    }
    return par;
}

// A split backward's plan whose gradients failed: which stage's W of which microbatch
// (verify/weight_probe.h), each probe's step 0 gathered whole on rank 0, nothing compared. On rank
// threads only: under mpirun the ranks would have to agree to run the probes.
void localise_split_backward(const VerifyState& s, const ResolvedPlan& resolved, PlanReport& rep) {
    if (!s.launch.shares_memory()) return;
    RecordOptions ro;
    ro.events = false;
    rep.localisation +=
        split_backward_localisation(rep, *resolved.plan, s.probe, [&](const ScheduleChange& change) {
            return std::move(
                run_parallel(s, resolved, 1, ro, {}, nullptr, change).record.steps.at(0).tensors);
        });
}

// The job's plan i: its lint (the plan's one resolution, which every rank rebinds), its reference (rank 0
// runs it, beside the ranks or first: under mpirun the other ranks wait for it), its parallel run compared
// with it, and its report.
void verify_plan(VerifyState& s, size_t i) {
    const VerifyJob& job = s.job;
    Launch& launch = s.launch;
    const Plan& plan = job.plans[i];
    const int64_t steps = steps_for(plan, job.options, s.probe.steps);
    const Resolution res = resolve_plan(s.probe, plan);  // the lint, before anything runs
    check_fault_target(job.options.fault, s.probe, plan);
    const ReferenceKey key = s.reference_key(plan);
    // the reference rank 0 records, resolved once; one the host cannot hold is exit 3 before the
    // lint draws its batch, not the OOM killer
    std::unique_ptr<const ResolvedReference> reference;
    if (launch.rank0() && !s.references.count(key)) {
        reference = std::make_unique<const ResolvedReference>(plan, s.probe);
        require_host_memory(job.inputs, reference->plan, steps, &reference->resolved);
    }
    const std::vector<Diagnostic> causes = plan_causes(s, plan, res, steps);
    if (launch.rank0())
        for (const auto& w : res.warnings) spdlog::warn("{}", w.str());
    RecordOptions ro = parallel_record_options(s, plan);
    const bool drop = s.drops_reference(i, key);
    std::unique_ptr<ReferenceBeside> beside;
    if (reference) beside = start_reference(s, plan, steps, ro, key, drop, std::move(reference));
    launch.wait_for_rank0();
    if (launch.rank0())
        compare_as_recorded(ro, beside ? &beside->stream.record : &s.references[key], beside.get(), drop,
                            plan, steps);
    const ReferenceLogs logs = launch.rank0() ? s.logs[key].view() : ReferenceLogs{};
    if (logs.routing) logs.routing->reset_replayed();  // this plan's own counts
    if (logs.float8) logs.float8->reset_taken(), logs.float8->set_tolerance(ro.tol.rtol, ro.tol.atol);
    // the lint's resolution: every rank's, rebound to its own model
    const ResolvedPlan resolved{&plan, &s.probe, &res};
    ParallelRun par;
    try {
        par = run_parallel(s, resolved, steps, ro, logs, beside.get());
    } catch (const ScheduleViolation& e) {  // every rank's Run refused the same lists before running
        if (launch.rank0()) add_unrunnable(s.report, plan, e.what(), ro.tol);
        return;
    }
    if (beside) {
        s.references[key] = beside->end();
        s.report.reference_seconds += s.references[key].seconds;
    }
    if (launch.rank0()) {
        add_plan(s.report, s.references[key], std::move(par.record), plan, res, causes, ro.tol,
                 job.options.strict);
        localise_split_backward(s, resolved, s.report.plans.back());
        std::vector<std::string>& notes = s.report.plans.back().notes;
        if (logs.routing && logs.routing->tokens() > 0)
            notes.push_back(routing_note(*logs.routing, job.options.replay_ties, par.taken.routings));
        if (logs.float8 && logs.float8->operands() > 0)
            notes.push_back(float8_note(*logs.float8, job.options.replay_ties, par.taken.float8_values));
    }
    if (!s.read_later(i, key)) s.logs.erase(key);  // no plan follows them again
}

}  // namespace

VerifyReport verify(const VerifyJob& job, Launch& launch) {
    VerifyState s(job, launch);
    for (size_t i = 0; i < job.plans.size(); ++i) verify_plan(s, i);
    return std::move(s.report);
}

}  // namespace ptool
