"""The reports of pb's Bayesian optimisation: test accuracies of the best trial and its
reproductions with 95 % confidence intervals, and ax's optimisation plots."""

import collections
import html
import os

import plotly.io
from ax.analysis.plotly.parallel_coordinates import ParallelCoordinatesPlot
from ax.analysis.plotly.plotly_analysis import PlotlyAnalysisCard
from ax.analysis.plotly.top_surfaces import TopSurfacesAnalysis
from ax.analysis.plotly.utility_progression import UtilityProgressionAnalysis
from powerful_benchmarker.utils import common_functions as pb_c_f
from powerful_benchmarker.utils import constants as const
from record_keeper.db_utils import DBManager

from ..stats import mean_ci
from . import files
from .protocol import STATUSES, ProtocolError

# columns of the evaluation records that are not accuracies (record-keeper >= 0.9.31 adds ~iteration~)
REPORT_EXCLUDED_PREFIXES = (
    const.TRAINED_STATUS_COL_NAME,
    "epoch",
    "SEM",
    "id",
    "experiment_id",
    "timestamp",
    "~",
)


def confidence_interval(values):
    """mean and 95 % t-interval of a list of numbers (NaN for a single number, the mean
    itself for equal numbers)."""
    mean, half_width = mean_ci(values)
    return {
        "mean": mean,
        "95%_confidence_interval": [mean - half_width, mean + half_width],
        "95%_confidence_interval_width": half_width,
    }


def accuracy_report(api_parser, global_db_path, experiments, folder, statuses=STATUSES):
    """report_<records>.yaml: per trained status, the mean and 95 % confidence interval
    of each test accuracy over ``experiments`` (the best trial and its reproductions);
    detailed_report_<records>.yaml: the rows they come from. Every experiment must have
    a row for every status (ProtocolError naming the missing ones)."""
    db = DBManager(global_db_path, is_global=True)
    for category in ("aggregator", "ensemble"):
        table = api_parser.get_eval_record_name_dict(split_names=["test"], for_inner_obj=category)["test"]
        base_name = pb_c_f.first_val_of_dict(api_parser.get_eval_record_name_dict(for_inner_obj=category))
        details, missing = {}, []
        values = collections.defaultdict(lambda: collections.defaultdict(list))
        for experiment in experiments:
            experiment_id = db.get_experiment_id(experiment)
            details[experiment] = {}
            for status in statuses:
                rows = db.query(
                    f"SELECT * FROM {table} WHERE experiment_id=? AND {const.TRAINED_STATUS_COL_NAME}=? "
                    "ORDER BY id DESC LIMIT 1",
                    (experiment_id, status),
                )
                if not rows:
                    missing.append(f"{experiment}/{status}")
                    continue
                row = dict(rows[0])
                details[experiment][status] = row
                for key, value in row.items():
                    if value is not None and not key.startswith(REPORT_EXCLUDED_PREFIXES):
                        values[status][key].append(value)
        if missing:
            raise ProtocolError(f"the test report {table} has no row for {', '.join(missing)}")
        summary = {
            status: {key: confidence_interval(v) for key, v in accuracies.items()}
            for status, accuracies in values.items()
        }
        files.write_yaml(os.path.join(folder, f"detailed_report_{base_name}.yaml"), details)
        files.write_yaml(os.path.join(folder, f"report_{base_name}.yaml"), summary)


def plot_progress(client, filename, title):
    """ax's optimisation trace, parallel coordinates and (once a model is fitted)
    response surfaces, in one HTML file (plotly.js included once, works offline)."""
    cards = client.compute_analyses(
        analyses=[UtilityProgressionAnalysis(), ParallelCoordinatesPlot(), TopSurfacesAnalysis()],
        display=False,
    )
    parts = [f"<h1>{html.escape(title)}</h1>"]
    include_plotlyjs = True
    for card in (c for group in cards for c in group.flatten()):
        parts.append(f"<h2>{html.escape(card.title)}</h2><p>{html.escape(card.subtitle)}</p>")
        if isinstance(card, PlotlyAnalysisCard):
            figure = card.get_figure()
            parts.append(plotly.io.to_html(figure, include_plotlyjs=include_plotlyjs, full_html=False))
            include_plotlyjs = False
    files.write_text(
        filename, '<html><head><meta charset="utf-8"></head><body>' + "\n".join(parts) + "</body></html>"
    )
