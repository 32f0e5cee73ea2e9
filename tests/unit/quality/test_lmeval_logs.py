"""lm-eval's own --log_samples output read as quality evidence (quality/lmeval_logs), on the
real logs of tests/data/imported/lmeval/ (see its README.md); each refusal on a copy of
them changed in one place."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantlab.core.errors import RecipeError
from quantlab.quality.compare import paired_values
from quantlab.quality.lmeval import read_samples
from quantlab.quality.lmeval_log_samples import restore_sample
from quantlab.quality.lmeval_logs import check_pairable, env_facts, read_eval_log, write_quantlab_form

DATA = Path(__file__).resolve().parents[2] / "data" / "imported" / "lmeval"
TASKS = ["ql_knowledge_mc", "ql_lastword", "ql_arithmetic", "ql_chat", "ql_prose_ppl"]
# each task's gated metric and filter, as the default suite names them
METRICS = {"ql_knowledge_mc": ("acc", None), "ql_lastword": ("acc", None),
           "ql_arithmetic": ("exact_match", "first-number"), "ql_chat": ("contains_answer", None),
           "ql_prose_ppl": ("word_perplexity", None)}


@pytest.fixture
def logs(tmp_path) -> tuple[Path, Path]:
    """Copies of the baseline's and the candidate's --output_path folders."""
    for role in ("baseline", "candidate"):
        shutil.copytree(DATA / role, tmp_path / role)
    return tmp_path / "baseline", tmp_path / "candidate"


def results(folder: Path) -> Path:
    return next(folder.glob("*/results_*.json"))


def samples(folder: Path, task: str) -> Path:
    return next(folder.glob(f"*/samples_{task}_*.jsonl"))


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def edit_lines(path: Path, change) -> None:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    changed = change(lines)
    lines = changed if isinstance(changed, list) and changed and isinstance(changed[0], dict) else lines
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def refused(call, *args, **kwargs) -> RecipeError:
    with pytest.raises(RecipeError) as err:
        call(*args, **kwargs)
    return err.value


# reading


def test_a_log_says_its_run_model_seeds_limit_and_environment():
    log = read_eval_log(DATA / "baseline")
    assert sorted(log.tasks) == sorted(TASKS) and len(log.files) == 6 and log.files[0] == log.results_file
    assert log.lm_eval_version == "0.4.13" and log.model_name == "tiny-llama-seed0"
    assert log.model_args == {"pretrained": "tiny-llama-seed0", "dtype": "float32"}
    assert log.seeds == {"random": 1234, "numpy": 1234, "torch": 1234, "fewshot": 1234} and log.limit == 12
    f = log.facts
    assert f["torch_version"] == "2.13.0+cpu" and f["transformers_version"] == "5.17.0" and f["device"] == "cpu"
    assert f["model_source"] == "hf" and f["model_dtype"] == "torch.float32" and f["date_id"] in log.results_file.name
    assert f["gpus"] is None and f["nvidia_driver_version"] is None and f["git_hash"] is None  # said: unknown
    assert f["cpu_model"] and f["os"].startswith("Debian")
    assert log.tasks["ql_chat"].n_shot == 2 and log.tasks["ql_knowledge_mc"].n_shot == 0
    assert log.tasks["ql_chat"].config["fewshot_config"]["sampler"] == "first_n"


def test_the_three_forms_of_the_path_read_the_same_run(logs):
    base, _ = logs
    files = {read_eval_log(p, ["ql_arithmetic"]).results_file for p in (base, results(base).parent, results(base))}
    assert files == {results(base)}


def test_each_row_is_quantlabs_own_form_with_the_answer_restored():
    log = read_eval_log(DATA / "baseline")
    raw = json.loads(samples(DATA / "baseline", "ql_knowledge_mc").read_text().splitlines()[0])
    mc = log.tasks["ql_knowledge_mc"].rows[0]
    lls = [float(x[0]) for x in raw["filtered_resps"]]
    choices = [a["arg_1"] for a in raw["arguments"].values()]
    assert mc["answer"] == choices[lls.index(max(lls))] and mc["target"] == 1 and mc["raw"] is None
    assert mc["prompt"] == raw["arguments"]["gen_args_0"]["arg_0"] and mc["prompt_hash"] == raw["prompt_hash"]
    assert set(mc) == {"doc_id", "filter", "prompt_hash", "prompt", "target", "answer", "raw", "metrics"}
    assert log.tasks["ql_lastword"].rows[0]["answer"].startswith(("greedy, logprob", "not greedy, logprob"))
    ppl = log.tasks["ql_prose_ppl"].rows[0]
    assert isinstance(ppl["answer"], float) and ppl["metrics"]["word_perplexity"][0] == ppl["answer"]
    gen = log.tasks["ql_arithmetic"].rows[0]
    assert gen["filter"] == "first-number" and isinstance(gen["raw"], str) and isinstance(gen["answer"], str)


def test_a_generated_number_stays_text_and_a_loglikelihood_pair_is_one_again():
    gen = {"doc_id": 0, "arguments": {"gen_args_0": {"arg_0": "Q: 2+2\nA:", "arg_1": {"until": ["\n"]}}},
           "resps": [["4"]], "filtered_resps": ["4"], "prompt_hash": "h", "target": "4"}
    assert restore_sample(gen, "generate_until", False)["filtered_resps"] == ["4"]
    assert restore_sample(gen, "generate_until", False)["target"] == "4"
    ll = {**gen, "arguments": {f"gen_args_{i}": {"arg_0": "c", "arg_1": f" {i}"} for i in range(12)},
          "resps": [[["-1.5", "True"]]] * 12, "filtered_resps": [["-1.5", "True"]] * 12, "target": "11"}
    out = restore_sample(ll, "multiple_choice", True)
    assert out["filtered_resps"][0] == (-1.5, True) and out["target"] == 11
    assert [a[1] for a in out["arguments"]] == [f" {i}" for i in range(12)]  # gen_args_10 after gen_args_9


def test_the_written_form_pairs_every_document_and_gives_the_logs_own_scores(logs, tmp_path):
    base, cand = (read_eval_log(p) for p in logs)
    for role, log in (("baseline", base), ("candidate", cand)):
        write_quantlab_form(log, tmp_path / role, TASKS)
    for task, (metric, filt) in METRICS.items():
        b_rows, b_summary = read_samples(tmp_path / "baseline", task)
        c_rows, _ = read_samples(tmp_path / "candidate", task)
        ids, b, c = paired_values(task, metric, filt, b_rows, c_rows)
        assert len(ids) == 12 and b_summary["n_samples"] == 12 and b_summary["seconds"] is None
        assert b_summary["lm_eval"] == "0.4.13" and metric in b_summary["higher_is_better"]
        if metric != "word_perplexity":  # a mean: the log's own aggregate from the paired values
            assert sum(b) / len(b) == pytest.approx(b_summary["results"][f"{metric},{filt or 'none'}"])
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "baseline").iterdir())


def test_the_real_logs_are_pairable_though_their_models_differ(logs):
    base, cand = (read_eval_log(p) for p in logs)
    assert base.model_name != cand.model_name and base.tasks["ql_chat"].config["metadata"] != \
        cand.tasks["ql_chat"].config["metadata"]  # the model's path is in each task's metadata
    check_pairable(base, cand, TASKS)


def test_secret_looking_model_arguments_are_redacted(logs):
    base, _ = logs
    secret = {"pretrained": "m", "api_key": "abc", "base_url": "http://u:pw@host:8000/v1/completions",
              "header": "Bearer abcdefghijklmnop"}
    edit_json(results(base), lambda d: (d["config"].update(model_args=secret),
                                        d["configs"]["ql_arithmetic"]["metadata"].update(secret)))
    log = read_eval_log(base, ["ql_arithmetic"])
    assert log.model_args == {"pretrained": "m", "api_key": "<redacted>", "base_url": "<redacted>",
                              "header": "<redacted>"} and log.model_name == "m"
    assert log.tasks["ql_arithmetic"].config["metadata"]["api_key"] == "<redacted>"
    edit_json(results(base), lambda d: d["config"].update(model_args="pretrained=m2,token=hf_" + "a" * 30))
    assert read_eval_log(base, ["ql_arithmetic"]).model_args == {"pretrained": "m2", "token": "<redacted>"}


def test_gpu_lines_of_torchs_environment_report_are_facts():
    torch_env = pytest.importorskip("torch.utils.collect_env")
    fields = {f: None for f in torch_env.SystemEnv._fields}
    fields.update(torch_version="2.9.0+cu128", cuda_compiled_version="12.8", cuda_runtime_version="12.8.93",
                  nvidia_gpu_models="GPU 0: NVIDIA H100 80GB HBM3\nGPU 1: NVIDIA H100 80GB HBM3",
                  nvidia_driver_version="570.124.06", os="Ubuntu 22.04.5 LTS (x86_64)")
    facts = env_facts(torch_env.pretty_str(torch_env.SystemEnv(**fields)))
    assert facts["gpus"] == ["GPU 0: NVIDIA H100 80GB HBM3", "GPU 1: NVIDIA H100 80GB HBM3"]
    assert facts["nvidia_driver_version"] == "570.124.06" and facts["cuda_built"] == "12.8"
    assert facts["torch_version"] == "2.9.0+cu128" and facts["cudnn_version"] is None
    fields.update(nvidia_gpu_models="NVIDIA A10G")
    assert env_facts(torch_env.pretty_str(torch_env.SystemEnv(**fields)))["gpus"] == ["NVIDIA A10G"]


# refused on reading


def test_a_folder_without_a_results_file(tmp_path):
    err = refused(read_eval_log, tmp_path)
    assert "no lm-eval results file" in str(err) and err.file == str(tmp_path)


def test_a_folder_of_several_runs_names_them_and_one_can_be_named(logs):
    base, _ = logs
    first = results(base)
    shutil.copy(first, first.with_name("results_2026-12-08T09-00-00.000001.json"))
    err = refused(read_eval_log, base)
    assert "2 lm-eval runs" in str(err) and first.name in str(err) and "results_2026-12-08T09" in str(err)
    assert read_eval_log(first).results_file == first  # named: its own date's samples files


def test_a_run_without_log_samples_is_told_to_add_it(logs):
    base, _ = logs
    for f in base.glob("*/samples_*.jsonl"):
        f.unlink()
    edit_json(results(base), lambda d: d.update(task_hashes={}))
    err = refused(read_eval_log, base)
    assert "--log_samples" in str(err) and err.file == str(results(base)) and err.field.startswith("configs.")


def test_a_samples_file_given_for_the_run(logs):
    err = refused(read_eval_log, samples(logs[0], "ql_chat"))
    assert "results_<date>.json beside it" in str(err)


def test_an_empty_samples_file(logs):
    base, _ = logs
    samples(base, "ql_chat").write_text("")
    err = refused(read_eval_log, base, ["ql_chat"])
    assert "empty" in str(err) and err.file == str(samples(base, "ql_chat"))


@pytest.mark.parametrize("text,field", [('{"version": 1}', "results"), ("not json at all", None),
                                        ('{"results": {}, "configs": []}', "configs")])
def test_a_file_that_is_not_lm_evals(tmp_path, text, field):
    path = tmp_path / "results_2026-12-07T12-15-09.516102.json"
    path.write_text(text)
    err = refused(read_eval_log, path)
    assert "not an lm-eval results file" in str(err) and err.field == field and err.file == str(path)


def test_a_sample_line_that_is_not_json_is_named_by_its_number(logs):
    base, _ = logs
    path = samples(base, "ql_arithmetic")
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:40]
    path.write_text("\n".join(lines) + "\n")
    err = refused(read_eval_log, base, ["ql_arithmetic"])
    assert err.field == "line 3" and err.file == str(path) and "not JSON" in str(err)


def test_a_sample_without_lm_evals_fields(logs):
    base, _ = logs
    edit_lines(samples(base, "ql_lastword"), lambda xs: xs[4].pop("prompt_hash"))
    assert refused(read_eval_log, base, ["ql_lastword"]).field == "line 5.prompt_hash"


def test_two_runs_appended_to_one_samples_file(logs):
    base, _ = logs
    edit_lines(samples(base, "ql_knowledge_mc"), lambda xs: xs + xs[:1])
    err = refused(read_eval_log, base, ["ql_knowledge_mc"])
    assert "more than one line" in str(err) and err.field == "line 13.doc_id"


def test_a_cut_samples_file(logs):
    base, _ = logs
    edit_lines(samples(base, "ql_prose_ppl"), lambda xs: xs[:10])
    err = refused(read_eval_log, base, ["ql_prose_ppl"])
    assert "n-samples.ql_prose_ppl.effective" in str(err) and err.file == str(samples(base, "ql_prose_ppl"))


def test_an_answer_of_the_wrong_shape(logs):
    base, _ = logs
    edit_lines(samples(base, "ql_lastword"), lambda xs: xs[0].update(filtered_resps=[["-1.0", "maybe"]]))
    assert refused(read_eval_log, base, ["ql_lastword"]).field == "line 1.filtered_resps"


def test_arguments_lm_eval_did_not_write(logs):
    base, _ = logs
    edit_lines(samples(base, "ql_chat"), lambda xs: xs[1].update(arguments={"gen_args_0": {"context": "q"}}))
    assert refused(read_eval_log, base, ["ql_chat"]).field == "line 2.arguments"


def test_a_task_the_log_lacks(logs):
    base, _ = logs
    err = refused(read_eval_log, base, ["ql_code"])
    assert err.field == "configs.ql_code" and "ql_arithmetic" in str(err)
    err = refused(write_quantlab_form, read_eval_log(base, ["ql_chat"]), base / "out", ["ql_arithmetic"])
    assert err.field == "configs.ql_arithmetic"


# refused as a pair


def pair(logs, tasks=None):
    return read_eval_log(logs[0], tasks), read_eval_log(logs[1], tasks)


def test_a_task_missing_on_one_side(logs):
    base, cand = read_eval_log(logs[0]), read_eval_log(logs[1], ["ql_chat"])
    err = refused(check_pairable, base, cand, ["ql_chat", "ql_arithmetic"])
    assert err.field == "configs.ql_arithmetic" and err.file == str(results(logs[1]))


def test_other_lm_eval_versions(logs):
    edit_json(results(logs[1]), lambda d: d.update(lm_eval_version="0.4.9"))
    err = refused(check_pairable, *pair(logs, ["ql_chat"]), ["ql_chat"])
    assert err.field == "lm_eval_version" and "0.4.9" in str(err) and "0.4.13" in str(err)


def test_another_limit(logs):
    edit_json(results(logs[1]), lambda d: d["config"].update(limit=20))
    assert refused(check_pairable, *pair(logs, ["ql_chat"]), ["ql_chat"]).field == "config.limit"


def test_another_few_shot_seed_matters_only_where_a_task_has_few_shot_examples(logs):
    edit_json(results(logs[1]), lambda d: d["config"].update(fewshot_seed=7))
    err = refused(check_pairable, *pair(logs), TASKS)
    assert err.field == "config.fewshot_seed" and "ql_chat" in str(err)
    check_pairable(*pair(logs, ["ql_arithmetic"]), ["ql_arithmetic"])  # no few-shot example: same prompts


def test_another_number_of_few_shot_examples(logs):
    edit_json(results(logs[1]), lambda d: (d["n-shot"].update(ql_chat=1),
                                           d["configs"]["ql_chat"].update(num_fewshot=1)))
    err = refused(check_pairable, *pair(logs, ["ql_chat"]), ["ql_chat"])
    assert err.field == "configs.ql_chat.num_fewshot" and err.file == str(results(logs[1]))


@pytest.mark.parametrize("field,value", [("generation_kwargs", {"until": ["\n"], "max_gen_toks": 64}),
                                         ("filter_list", []), ("doc_to_text", "{{question}}")])
def test_a_task_defined_otherwise(logs, field, value):
    edit_json(results(logs[1]), lambda d: d["configs"]["ql_arithmetic"].update({field: value}))
    err = refused(check_pairable, *pair(logs, ["ql_arithmetic"]), ["ql_arithmetic"])
    assert err.field == f"configs.ql_arithmetic.{field}"


def test_other_documents(logs):
    edit_lines(samples(logs[1], "ql_knowledge_mc"), lambda xs: xs[5].update(doc_id=40))
    err = refused(check_pairable, *pair(logs, ["ql_knowledge_mc"]), ["ql_knowledge_mc"])
    assert err.field == "doc_id" and "[5]" in str(err) and "[40]" in str(err)


@pytest.mark.parametrize("key", ["prompt_hash", "target_hash", "doc_hash"])
def test_other_prompts_or_targets_name_the_first_documents(logs, key):
    edit_lines(samples(logs[1], "ql_arithmetic"), lambda xs: [x.update({key: "0" * 64}) for x in (xs[3], xs[7])])
    err = refused(check_pairable, *pair(logs, ["ql_arithmetic"]), ["ql_arithmetic"])
    assert err.field == key and "doc ids [3, 7]" in str(err) and err.file == str(samples(logs[1], "ql_arithmetic"))
